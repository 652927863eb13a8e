"""Which decode contract a model class speaks, and what each decode sends it.

tt-metal generators come in two generations (vllm-tt-plugin ``docs/DECODE_RELOAD_CONTRACT.md``
at b635d860, "TT Decode Reload Contract"; the negotiation the plugin's runner does):

- **version 0** (no ``decode_input_update_contract`` attribute, or 0): the legacy call shape.
  A device-sampling decode gets ``reset_batch`` (True when the request layout changed); nothing
  else is added. A host-sampling decode gets neither.
- **version >= 1**: every decode gets four keyword-only commands, chosen by the transition
  table below, and ``slot_remap`` (``remap[i] = j``: row ``i`` reads the state in slot ``j``),
  in both sampling modes. ``reset_batch`` is never sent (a v1 class may reject it by name).

Transition table (inputs / page table only / sampling params / sampling state):

- first decode, first decode after a prefill (a chunked-prefill continuation is one), a request
  add/remove/reuse (the layout changed), a host->device sampling switch: full reload, params
  and state reset when sampling on the device;
- steady host sampling: full input reload every step;
- steady device sampling: inputs stay resident; page tables only when a row's blocks changed;
- decode tracing off, or no ``supports_async_decode``: full input reload every step.

Invariants (``DecodeCommands`` refuses to exist otherwise): never ``reload_inputs`` together with
``reload_page_table``; ``reset_sampling_state`` implies ``reload_inputs``.

``slot_remap``: a row keeps its global slot for its whole life here (the scheduler never
condenses the batch; ``RowPlan.row`` == slot), so the remap is always the identity over the
wire's ``B_wire`` slots (lanes: one process submits the merged lane batch, indexed by global
slot). A reused slot is identity too; the new occupant is signalled by the state reset. The
"transition pending" signal is sticky until a decode submission is accepted (``accepted``): a
``decode_forward`` that raised claims nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accel.tt.mesh_model import SUPPORTS_ASYNC_DECODE

CONTRACT_ATTR = "decode_input_update_contract"


def contract_version(model: Any) -> int:
    """The class's declared decode contract version (0 when absent or None)."""
    return int(getattr(model, CONTRACT_ATTR, 0) or 0)


@dataclass(frozen=True)
class DecodeCommands:
    """The four version-1 commands of one decode."""

    reload_inputs: bool
    reload_page_table: bool
    reload_sampling_params: bool
    reset_sampling_state: bool

    def __post_init__(self) -> None:
        if self.reload_inputs and self.reload_page_table:
            raise ValueError("reload_inputs already includes the page tables: never both true")
        if self.reset_sampling_state and not self.reload_inputs:
            raise ValueError("reset_sampling_state needs authoritative inputs (reload_inputs)")

    def as_kwargs(self) -> dict[str, bool]:
        return {
            "reload_inputs": self.reload_inputs,
            "reload_page_table": self.reload_page_table,
            "reload_sampling_params": self.reload_sampling_params,
            "reset_sampling_state": self.reset_sampling_state,
        }


FULL_RELOAD = DecodeCommands(True, False, False, False)


class DecodeContract:
    """Per-runner state of the negotiated contract: ``decode_kwargs`` for each prepared decode,
    ``note_prefill`` after every prefill, ``accepted`` once ``decode_forward`` returned."""

    def __init__(self, model: Any, *, decode_trace: bool, width: int) -> None:
        self.version = contract_version(model)
        caps = getattr(model, "model_capabilities", None) or {}
        # Inputs may stay resident only on a traced decode of a class certified for it.
        self.can_keep_resident = decode_trace and bool(caps.get(SUPPORTS_ASYNC_DECODE, False))
        self._identity = list(range(width))
        self._transition_pending = True  # the first decode is a transition
        self._last_on_device = False  # the last accepted decode sampled on the device

    def note_prefill(self) -> None:
        self._transition_pending = True

    def decode_kwargs(self, *, layout_changed: bool, on_device: bool, page_table_changed: bool) -> dict[str, Any]:
        """The contract's keywords for one decode (besides tokens, positions, tables, params)."""
        if self.version < 1:
            return {"reset_batch": layout_changed} if on_device else {}
        if layout_changed:  # sticky until a submission is accepted
            self._transition_pending = True
        commands = self.commands(layout_changed, on_device, page_table_changed)
        return {**commands.as_kwargs(), "slot_remap": list(self._identity)}

    def commands(self, layout_changed: bool, on_device: bool, page_table_changed: bool) -> DecodeCommands:
        transition = self._transition_pending or layout_changed or (on_device and not self._last_on_device)
        if transition:
            return DecodeCommands(True, False, on_device, on_device)
        if not on_device or not self.can_keep_resident:
            return FULL_RELOAD
        return DecodeCommands(False, page_table_changed, False, False)

    def accepted(self, on_device: bool) -> None:
        """A decode submission was accepted: retire the sticky transition signal."""
        self._transition_pending = False
        self._last_on_device = on_device
