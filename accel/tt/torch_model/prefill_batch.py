"""A prefill call's inputs on the host: checked, snapshotted, and grouped by padded length.

Built on the caller's (the engine's step) thread in numpy, so the step thread runs no torch op
that would give up the GIL (``accel.tt.host_arrays``); the program builds each group's tensors.
Sequence padding is per row, as tt-metal's generator pads each user to its own
``get_padded_prefill_len``: rows are grouped by bucket and each group runs padded to its own
bucket, so one 129-token chunk does not pad seven 128-token ones to 256.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from accel.tt.host_arrays import host_copy
from accel.tt.torch_model.paged_attention import PagedKVStore, check_block_ids, num_ctx_blocks
from accel.tt.torch_model.warmup import CTX_TOKEN_ALIGN, prefill_bucket, round_up


@dataclass(frozen=True)
class PrefillGroup:
    length: int  # the bucket every row of the group is padded to
    rows: np.ndarray  # int64 [k], caller rows
    num_ctx_blocks: int  # context blocks the group's longest row reads


@dataclass(frozen=True)
class PrefillBatch:
    """``n`` rows; host arrays int64: ``tokens`` ``[n, width]``, ``starts`` / ``ends`` / ``lanes``
    ``[n]`` (the model processes ``tokens[i, starts[i]:ends[i]]``), ``table`` ``[n, W]``
    lane-local; ``slots`` each row's global slot."""

    tokens: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    lanes: np.ndarray
    table: np.ndarray
    slots: tuple[int, ...]
    groups: tuple[PrefillGroup, ...]

    @staticmethod
    def stage(
        tokens: Any,
        page_table: Any,
        prompt_lens: Sequence[int],
        start_pos: Sequence[int] | None,
        empty_slots: Sequence[int] | None,
        store: PagedKVStore,
        *,
        per_lane: int,
        num_slots: int,
        max_seq_len: int,
    ) -> PrefillBatch:
        """``prefill_forward``'s arguments, checked (raises ValueError on a bad chunk, slot or block id)."""
        tokens_host = host_copy(tokens, np.int64)
        n = tokens_host.shape[0]
        ends = np.array(list(prompt_lens), dtype=np.int64)
        starts = np.array([0] * n if start_pos is None else list(start_pos), dtype=np.int64)
        slots = tuple(range(n)) if empty_slots is None else tuple(int(s) for s in empty_slots)
        if empty_slots is None and num_slots > per_lane:
            raise ValueError("prefill_forward needs empty_slots (the global slot of each row) with lanes > 1")
        max_end = int(ends.max())
        if max_end > max_seq_len or bool((starts >= ends).any()) or max_end > tokens_host.shape[1]:
            raise ValueError(
                f"bad prefill chunk: start_pos={starts.tolist()} prompt_lens={ends.tolist()} "
                f"tokens width {tokens_host.shape[1]} max_seq_len {max_seq_len}"
            )
        if any(not 0 <= s < num_slots for s in slots):
            raise ValueError(f"empty_slots {list(slots)} outside the {num_slots} global slots")
        table = host_copy(page_table, np.int64)
        buckets = np.array([prefill_bucket(int(c)) for c in ends - starts], dtype=np.int64)
        groups = []
        for length in sorted(set(buckets.tolist())):
            rows = np.flatnonzero(buckets == length)
            groups.append(PrefillGroup(length, rows, num_ctx_blocks(int(ends[rows].max()), store, table.shape[1])))
        check_block_ids(table, ends, store)
        lanes = np.array([s // per_lane for s in slots], dtype=np.int64)
        return PrefillBatch(tokens_host, starts, ends, lanes, table, slots, tuple(groups))

    def order(self) -> torch.Tensor:
        """Row ``i`` of the groups' concatenated outputs belongs to caller row ``order()[i]``."""
        return torch.from_numpy(np.concatenate([g.rows for g in self.groups]))

    def group_inputs(self, group: PrefillGroup) -> GroupInputs:
        """``decoder_forward``'s per-row inputs for ``group``, padded to its length (in the program)."""
        tokens, ends, starts, lanes, page_table = (
            torch.from_numpy(a[group.rows]) for a in (self.tokens, self.ends, self.starts, self.lanes, self.table)
        )
        offsets = torch.arange(group.length)[None, :]
        positions = torch.minimum(starts[:, None] + offsets, (ends - 1)[:, None])  # padding clamped
        return GroupInputs(
            tokens.gather(1, positions),
            positions,
            offsets < (ends - starts)[:, None],
            lanes,
            page_table,
            group.num_ctx_blocks,
            ends - starts - 1,
            round_up(int(self.ends[group.rows].max()), CTX_TOKEN_ALIGN),
        )


class GroupInputs(NamedTuple):
    """``decoder_forward``'s arguments after the store, in its order (``[k, L]`` / ``[k]``)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    is_written: torch.Tensor
    lanes: torch.Tensor
    page_table: torch.Tensor
    num_ctx_blocks: int
    last_index: torch.Tensor
    num_ctx_tokens: int
