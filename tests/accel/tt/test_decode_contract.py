"""``DecodeContract``: the negotiated call shape and vllm-tt-plugin's transition table
(``docs/DECODE_RELOAD_CONTRACT.md`` at b635d860), step by step, without a model."""

from __future__ import annotations

import itertools

import pytest

from accel.tt.decode_contract import DecodeCommands, DecodeContract, contract_version


class _Legacy:
    model_capabilities = {"supports_async_decode": True}


class _V1(_Legacy):
    decode_input_update_contract = 1


class _V1NoAsync:
    decode_input_update_contract = 1
    model_capabilities = {"supports_async_decode": False}


def _cmds(kw: dict) -> tuple[bool, bool, bool, bool]:
    return (kw["reload_inputs"], kw["reload_page_table"], kw["reload_sampling_params"], kw["reset_sampling_state"])


def test_version_is_read_from_the_class_and_inherited():
    assert contract_version(_Legacy()) == 0
    assert contract_version(_V1()) == 1
    assert contract_version(type("Sub", (_V1,), {})()) == 1
    assert contract_version(type("Holdout", (_V1,), {"decode_input_update_contract": 0})()) == 0


def test_version_0_gets_reset_batch_on_device_decodes_and_nothing_else():
    c = DecodeContract(_Legacy(), decode_trace=True, width=4)
    assert c.decode_kwargs(layout_changed=True, on_device=True, page_table_changed=True) == {"reset_batch": True}
    c.accepted(True)
    assert c.decode_kwargs(layout_changed=False, on_device=True, page_table_changed=True) == {"reset_batch": False}
    assert c.decode_kwargs(layout_changed=True, on_device=False, page_table_changed=False) == {}


def test_version_1_walks_the_transition_table():
    c = DecodeContract(_V1(), decode_trace=True, width=4)
    step = c.decode_kwargs(layout_changed=True, on_device=True, page_table_changed=True)
    assert "reset_batch" not in step and step["slot_remap"] == [0, 1, 2, 3]
    assert _cmds(step) == (True, False, True, True)  # first decode: full reload, params, state reset
    c.accepted(True)
    steady = c.decode_kwargs(layout_changed=False, on_device=True, page_table_changed=False)
    assert _cmds(steady) == (False, False, False, False)  # inputs stay resident
    c.accepted(True)
    blocks = c.decode_kwargs(layout_changed=False, on_device=True, page_table_changed=True)
    assert _cmds(blocks) == (False, True, False, False)  # page-table-only refresh
    c.accepted(True)
    c.note_prefill()  # a prefill (a chunked continuation too) breaks the steady state
    assert _cmds(c.decode_kwargs(layout_changed=False, on_device=True, page_table_changed=False)) == (
        True,
        False,
        True,
        True,
    )
    c.accepted(True)
    left = c.decode_kwargs(layout_changed=True, on_device=True, page_table_changed=True)  # a row left
    assert _cmds(left) == (True, False, True, True) and left["slot_remap"] == [0, 1, 2, 3]
    c.accepted(True)
    host = c.decode_kwargs(layout_changed=True, on_device=False, page_table_changed=False)
    assert _cmds(host) == (True, False, False, False) and host["slot_remap"] == [0, 1, 2, 3]
    c.accepted(False)
    assert _cmds(c.decode_kwargs(layout_changed=False, on_device=False, page_table_changed=True)) == (
        True,
        False,
        False,
        False,
    )  # steady host sampling: full reload every step
    c.accepted(False)
    switch = c.decode_kwargs(layout_changed=False, on_device=True, page_table_changed=False)
    assert _cmds(switch) == (True, False, True, True)  # host -> device
    c.accepted(True)


@pytest.mark.parametrize("model, trace", [(_V1NoAsync(), True), (_V1(), False)])
def test_without_async_decode_or_tracing_every_decode_is_a_full_reload(model, trace):
    c = DecodeContract(model, decode_trace=trace, width=2)
    c.decode_kwargs(layout_changed=True, on_device=True, page_table_changed=True)
    c.accepted(True)
    for table_changed in (False, True):
        kw = c.decode_kwargs(layout_changed=False, on_device=True, page_table_changed=table_changed)
        assert _cmds(kw) == (True, False, False, False)
        c.accepted(True)


def test_a_transition_stays_pending_until_a_submission_is_accepted():
    c = DecodeContract(_V1(), decode_trace=True, width=2)
    c.decode_kwargs(layout_changed=True, on_device=True, page_table_changed=True)
    c.accepted(True)
    c.decode_kwargs(layout_changed=True, on_device=True, page_table_changed=False)  # decode_forward raised
    retry = c.decode_kwargs(layout_changed=False, on_device=True, page_table_changed=False)
    assert _cmds(retry) == (True, False, True, True)


def test_the_invariants_hold_for_every_input_and_are_refused_when_built_by_hand():
    for changed, on_device, table, prev_device, prefill in itertools.product([False, True], repeat=5):
        c = DecodeContract(_V1(), decode_trace=True, width=2)
        c.decode_kwargs(layout_changed=True, on_device=prev_device, page_table_changed=True)
        c.accepted(prev_device)
        if prefill:
            c.note_prefill()
        inputs, table_only, _, reset = _cmds(
            c.decode_kwargs(layout_changed=changed, on_device=on_device, page_table_changed=table)
        )
        assert not (inputs and table_only)
        assert inputs or not reset
    with pytest.raises(ValueError, match="never both"):
        DecodeCommands(True, True, False, False)
    with pytest.raises(ValueError, match="reset_sampling_state"):
        DecodeCommands(False, False, True, True)
