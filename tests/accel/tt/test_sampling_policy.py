"""SamplingPolicy: device sampling only when the whole batch allows it."""

from __future__ import annotations

import pytest

from accel.contract import SamplingParams, StructuredOutputSpec
from accel.tt.mesh_model import MAX_DEVICE_TOP_K, SUPPORTS_DEVICE_PENALTIES, SUPPORTS_SAMPLE_ON_DEVICE
from accel.tt.sampling_policy import SamplingPolicy, device_logprobs_limit
from accel.tt.step_plan import RowPlan, StepMode, StepPlan

CAPS = {SUPPORTS_SAMPLE_ON_DEVICE: True}


def row(rid="a", samples=True, **sp):
    return RowPlan(
        req_id=rid,
        lane=0,
        row=0,
        start_pos=0,
        end_pos=4,
        input_token_ids=(1, 2, 3, 4),
        block_ids=(0,),
        samples=samples,
        sampling=SamplingParams(**sp),
        num_output_tokens=0,
    )


def plan(*rows, mode=StepMode.DECODE):
    return StepPlan(step_id=1, mode=mode, per_lane=4, num_lanes=1, rows=tuple(rows))


def policy(mode="all", compat=False, caps=CAPS):
    return SamplingPolicy(mode, compat, caps)


def test_plain_rows_sample_on_device():
    assert policy().use_device(plan(row(temperature=0), row("b", temperature=0.7, top_k=20)))


@pytest.mark.parametrize(
    "params, reason",
    [
        ({"logprobs": 0}, "logprobs"),
        ({"logprobs": 3}, "logprobs"),
        ({"presence_penalty": 0.5}, "penalties"),
        ({"frequency_penalty": 0.5}, "penalties"),
        ({"repetition_penalty": 1.2}, "penalties"),
        ({"logit_bias": {"5": 3.0}}, "logit_bias"),
        ({"min_tokens": 2, "max_tokens": 8}, "min_tokens"),
        ({"min_p": 0.1}, "min_p"),
    ],
)
def test_one_offending_row_sends_the_whole_batch_to_host(params, reason):
    caps = {**CAPS, SUPPORTS_DEVICE_PENALTIES: False}
    p = plan(row("ok", temperature=0), row("bad", **params))
    assert not policy(caps=caps).use_device(p)
    assert policy(caps=caps).host_reason(p) == f"bad: {reason}"


def test_device_penalties_follow_the_plugins_key_and_default():
    """``supports_device_penalties`` is the plugin's key, True when absent; a prefill never
    samples penalties on the device (the plugin sends token histories with decodes only)."""
    penalized = row("p", repetition_penalty=1.2)
    assert policy().use_device(plan(penalized))  # absent: True, as the plugin reads it
    declined = {**CAPS, SUPPORTS_DEVICE_PENALTIES: False}
    assert policy(caps=declined).host_reason(plan(penalized)) == "p: penalties"
    assert policy().host_reason(plan(penalized, mode=StepMode.PREFILL)).startswith("p: penalties on a prefill")


def test_device_logprobs_as_the_plugin_serves_them():
    assert device_logprobs_limit(1, "llama") is None  # single device: host (tt-metal#34077)
    assert device_logprobs_limit(8, "llama") == 0  # the sampled token's only
    assert device_logprobs_limit(32, "gpt_oss") == 32  # the top-32 pair
    on_t3k = SamplingPolicy("all", False, CAPS, device_logprobs_limit(8, "llama"))
    assert on_t3k.use_device(plan(row("a", logprobs=0)))
    assert on_t3k.host_reason(plan(row("a", logprobs=1))) == "a: logprobs"


def test_intermediate_prefill_row_forces_host():
    p = plan(row("a"), row("chunk", samples=False), mode=StepMode.PREFILL)
    assert policy().host_reason(p) == "chunk: intermediate chunked-prefill row"
    assert policy().use_device(plan(row("a"), mode=StepMode.PREFILL))


def test_modes_and_switches():
    decode, prefill = plan(row()), plan(row(), mode=StepMode.PREFILL)
    assert policy("decode_only").use_device(decode)
    assert not policy("decode_only").use_device(prefill)
    assert not policy(None).use_device(decode)
    assert policy(compat=True).host_reason(decode) == "always_compat_sampling"
    assert not policy(caps={}).use_device(decode)


def test_device_top_k_limit_when_the_model_declares_one():
    caps = {**CAPS, MAX_DEVICE_TOP_K: 32}
    assert policy(caps=caps).use_device(plan(row(temperature=0.8, top_k=32)))
    assert policy(caps=caps).use_device(plan(row(temperature=0)))  # greedy ignores top_k
    assert not policy(caps=caps).use_device(plan(row(temperature=0.8)))  # top_k off = full vocab
    assert not policy(caps=caps).use_device(plan(row(temperature=0.8, top_k=64)))


@pytest.mark.parametrize(
    "sp",
    [
        {"structured_outputs": StructuredOutputSpec(choice=["a"])},
        {"allowed_token_ids": [1, 2]},
        {"bad_words": ["x"], "bad_words_token_ids": [[3]]},
    ],
)
def test_logit_masks_send_the_batch_to_the_host(sp):
    p = policy()
    assert not p.use_device(plan(row(temperature=0), row("b", temperature=0, **sp), mode=StepMode.DECODE))
    assert "host logit masks" in (p.host_reason(plan(row("b", **sp))) or "")
