"""A decode-contract version-1 tt-metal vLLM generator, for host tests: the explicit reload
commands and ``slot_remap``, HF's numbers.

Written from vllm-tt-plugin ``docs/DECODE_RELOAD_CONTRACT.md`` at
b635d860d8f03856b405c5398ab2152584a9c9e1 ("TT Decode Reload Contract": the commands, the
transition table, host input authority, the correctness invariant, "Requirements for
``decode_input_update_contract = 1``" and "Additional requirements for ``supports_async_decode``")
and the v1 adapter shape that document gives (``decode_forward(*, tokens, start_pos, page_table,
kv_cache, enable_trace, read_from_device, reload_inputs, reload_page_table,
reload_sampling_params, reset_sampling_state, slot_remap=None, **kwargs)``, ``reset_batch``
rejected by name), and tt-metal ``models/common/decode_contract.py`` at
40f4746e27acded3f2eaf7307bd1c3a2a86f7add (what the shared generators do with the commands:
``decode_input_staging`` -- all / page table only / none, both-true a ``ValueError``;
``reject_legacy_reload_signal`` -- ``reset_batch`` a ``ValueError`` naming it;
``rank_local_slot_remap`` -- ``slot_remap`` holds global slot indices, each lane takes its slice
rebased, a move across lanes is an error). That revision's ``generator.py`` itself was not
readable in the source store; the README says so.

Everything else (HF logits from the row's KV cells, device sampling, read-back in two steps) is
the legacy double's (``../../tt_llama``), which this class extends; only the decode entry point,
warmup and the per-layer allocator differ.

Version-1 semantics kept here, so a wrong command gives a wrong token or a loud error, never a
silent pass:

- the four commands are keyword-only and required; ``reload_inputs`` with ``reload_page_table``
  and ``reset_sampling_state`` without ``reload_inputs`` are rejected;
- persistent decode buffers (tokens, positions, page table, sampling params): copied from the host
  only as commanded. With ``reload_inputs=False`` the host's ``tokens`` / ``start_pos`` are
  ignored (stale by contract) and the trace runs on what the last device-sampled decode left:
  its sampled tokens and positions advanced by one. The page table is the resident one unless
  ``reload_page_table``;
- device sampling uses the resident params, uploaded only on ``reload_sampling_params``;
- ``slot_remap`` (absolute: row ``i`` reads slot ``remap[i]``) is applied once to the resident
  slot state on every decode; a missing remap is an error;
- ``reset_batch`` is a ``ValueError`` naming it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

_LEGACY_DIR = Path(__file__).resolve().parents[2] / "tt_llama"
if str(_LEGACY_DIR) not in sys.path:
    sys.path.append(str(_LEGACY_DIR))

from hf_contract_generator import HFContractGenerator, _DeviceTensor  # noqa: E402


class ContractError(AssertionError):
    """The engine sent a command combination or state the contract forbids."""


class HFContractGeneratorV1(HFContractGenerator):
    decode_input_update_contract = 1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._resident: tuple[list[int], list[int]] | None = None  # tokens, positions per slot
        self._resident_table: torch.Tensor | None = None
        self._resident_sampling: Any = None

    # ---- KV: the per-layer allocator current tt_transformers generators offer ----
    def allocate_kv_cache_per_layer(self, per_layer_specs):
        self.calls.append(("allocate_kv_cache_per_layer", {"per_layer_specs": per_layer_specs}))
        return self._zero_kv(per_layer_specs)

    # ---- decode ----
    def decode_forward(
        self,
        *,
        tokens,
        start_pos,
        page_table,
        kv_cache,
        enable_trace,
        read_from_device,
        reload_inputs,
        reload_page_table,
        reload_sampling_params,
        reset_sampling_state,
        slot_remap=None,
        sampling_params=None,
        prompt_tokens=None,
        output_tokens=None,
        **kwargs,
    ):
        self._log_decode(
            dict(
                kwargs,
                tokens=tokens,
                start_pos=start_pos,
                page_table=page_table,
                kv_cache=kv_cache,
                enable_trace=enable_trace,
                read_from_device=read_from_device,
                reload_inputs=reload_inputs,
                reload_page_table=reload_page_table,
                reload_sampling_params=reload_sampling_params,
                reset_sampling_state=reset_sampling_state,
                slot_remap=slot_remap,
                sampling_params=sampling_params,
            )
        )
        if "reset_batch" in kwargs:
            raise ValueError("reset_batch is not part of the decode input-update contract")
        commands = dict(
            reload_inputs=reload_inputs,
            reload_page_table=reload_page_table,
            reload_sampling_params=reload_sampling_params,
            reset_sampling_state=reset_sampling_state,
        )
        if not all(isinstance(v, bool) for v in commands.values()):
            raise TypeError(f"the commands are booleans, got {commands}")
        self.calls.append(("decode", dict(commands, sampling_params=sampling_params, slot_remap=slot_remap)))
        if reload_inputs and reload_page_table:
            raise ValueError("reload_page_table is meaningless with reload_inputs=True (both true)")
        if reset_sampling_state and not reload_inputs:
            raise ContractError("reset_sampling_state without reload_inputs")
        batch = tokens.shape[0]
        assert batch == self.max_batch_size, "a traced decode runs its captured batch"
        if slot_remap is None or len(slot_remap) != batch:
            raise ContractError(f"slot_remap must come with every v1 decode, one entry per slot: {slot_remap}")
        self._apply_remap(self._lane_remaps([int(j) for j in slot_remap]))
        on_device = sampling_params is not None
        if reload_sampling_params:
            self._resident_sampling = sampling_params
        if reload_inputs:
            inputs = [int(t) for t in tokens.reshape(batch, -1)[:, 0].tolist()]
            positions = [int(p) for p in start_pos.tolist()]
            table = page_table.clone()
        else:
            if not (on_device and enable_trace and self._resident is not None):
                raise ContractError("inputs can stay resident only after a traced, device-sampled decode")
            inputs, positions = (list(v) for v in self._resident)
            assert self._resident_table is not None
            table = page_table.clone() if reload_page_table else self._resident_table
        self._resident_table = table
        if on_device and self._resident_sampling is None:
            raise ContractError("device sampling before any reload_sampling_params")
        logits = torch.zeros(batch, 1, self.vocab_size)
        for row, pos in enumerate(positions):
            if pos < 0:
                continue  # empty slot
            lane, blocks = self._lane(row), table[row].tolist()
            self._write_kv(lane, blocks, pos, inputs[row])
            logits[row, 0] = self._last_logits(self._read_kv(lane, blocks, pos + 1))
        if not on_device:
            out = _DeviceTensor(logits)
            self._resident = (inputs, positions)  # host sampling: the next decode reloads anyway
        else:
            sampled = self._sample(
                logits[:, 0],
                self._resident_sampling,
                positions=[p + 1 for p in positions],
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
            )
            out = _DeviceTensor(sampled)
            next_tokens = sampled[0] if isinstance(sampled, tuple) else sampled
            # the trace writes the sampled token back and advances the position once
            self._resident = ([int(t) for t in next_tokens], [p + 1 if p >= 0 else p for p in positions])
        if read_from_device:
            return self.process_decode_output_host(self.read_decode_output(out), is_tokens=on_device)
        return out

    def _lane_remaps(self, slot_remap: list[int]) -> list[int]:
        """The global remap, checked lane by lane as ``rank_local_slot_remap`` rebases it: each
        lane's slice may only move rows within that lane."""
        stride = len(slot_remap) // self.data_parallel
        for lane in range(self.data_parallel):
            base = lane * stride
            for j in slot_remap[base : base + stride]:
                if not base <= j < base + stride:
                    raise ValueError(f"slot_remap moves a request across lane {lane}: {slot_remap}")
        return slot_remap

    def _apply_remap(self, remap: list[int]) -> None:
        """Row ``i`` takes slot ``remap[i]``'s resident state (exactly once, absolute)."""
        if self._resident is None or remap == list(range(len(remap))):
            return
        tokens, positions = self._resident
        self._resident = ([tokens[j] for j in remap], [positions[j] for j in remap])
        if self._resident_table is not None:
            self._resident_table = self._resident_table[remap]

    # ---- warmup (current WarmupForwardMixin) ----
    def warmup_model_decode(self, kv_cache, enable_trace, max_batch_size, num_blocks, can_sample_on_device):
        self.calls.append(("warmup_decode", dict(enable_trace=enable_trace, max_batch_size=max_batch_size)))
        self._log("warmup_decode")
        self.decode_forward(
            tokens=torch.zeros(max_batch_size, 1, dtype=torch.int32),
            start_pos=torch.full((max_batch_size,), -1, dtype=torch.int32),
            page_table=torch.zeros(max_batch_size, num_blocks, dtype=torch.int32),
            kv_cache=kv_cache,
            enable_trace=enable_trace,
            read_from_device=True,
            reload_inputs=True,
            reload_page_table=False,
            reload_sampling_params=False,
            reset_sampling_state=False,
            slot_remap=list(range(max_batch_size)),
        )
