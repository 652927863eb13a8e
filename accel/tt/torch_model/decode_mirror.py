"""Each decode slot's context kept contiguous, so a CPU decode step reads it in place.

Why: the paged store (``paged_attention.PagedKVStore``) is the KV of record, and attention over it
first gathers every row's pages into one tensor. On CPU that copy cost more than the attention
itself (tiny-llama, 32 rows x 256 keys, one layer: page gather 340 us, SDPA 290 us), and it is
repeated every decode step for a context that grew by one token. A paged-SDPA kernel on a mesh
reads the pages where they are; the torch program gets the same effect by keeping, per slot, the
context it gathered last step and appending each new token's K/V to it.

Layout: per layer, K and V ``[B_wire, Hkv, max_seq_len, D]``, SDPA's layout, so a decode step's
keys are the view ``[:, :, :C]``. Only decode reads it; prefill and imports write the paged store
alone.

Validity (host side, numpy, on the engine's step thread): slot ``s`` holds positions ``[0,
length[s])`` of the context its page-table row ``table[s]`` addressed when they were copied. A
decode row at position ``p`` may read the mirror only if ``length[s] == p`` and its page table
still starts with those blocks; otherwise the step first refills ``[0, p)`` for that row from the
store (one gather, the cost every step paid before). A slot is invalidated when a prefill writes
it, when it is empty in a decode, and when the engine says its occupant changed
(``TorchMeshModel.use_host_inputs``): a new occupant can reuse freed block ids at the very next
position, so ids and lengths alone cannot tell them apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from accel.tt.torch_model.paged_attention import PagedKVStore


@dataclass(frozen=True)
class MirrorStep:
    """One decode step's use of the mirror. ``refill_rows`` int64 ``[k]`` rows to copy from the
    store first, ``refill_blocks`` int64 ``[k * refill_num_blocks]`` their global block ids
    (row-major), covering ``refill_num_blocks * block_size >= refill_len`` positions."""

    refill_rows: torch.Tensor | None
    refill_blocks: torch.Tensor | None
    refill_num_blocks: int
    refill_len: int


# A mirror this small is built whatever the paged KV's size (see ``build_mirror``).
MIRROR_SMALL_BYTES = 64 << 20


def build_mirror(store: PagedKVStore, slot_lanes: Sequence[int], max_len: int) -> DecodeMirror | None:
    """The decode mirror for ``store``'s model, or None where it keeps gathering pages: off CPU
    (CUDA not measured), or where holding every slot at full length would more than double the
    KV memory and is not small anyway. ``slot_lanes[s]``: decode slot ``s``'s lane."""
    keys = store.keys[0]
    _, _, num_kv_heads, head_dim = keys.shape
    num_bytes = 2 * len(store.keys) * len(slot_lanes) * num_kv_heads * max_len * head_dim * keys.element_size()
    if keys.device.type != "cpu" or num_bytes > max(store.num_bytes, MIRROR_SMALL_BYTES):
        return None
    lane_base = np.asarray(slot_lanes, dtype=np.int64) * store.num_blocks
    return DecodeMirror(len(store.keys), num_kv_heads, max_len, head_dim, keys.dtype, store.block_size, lane_base)


class DecodeMirror:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        block_size: int,
        lane_base: np.ndarray,
    ) -> None:
        """``lane_base`` int64 ``[num_slots]``: each slot's first global block id in the store."""
        num_slots = len(lane_base)
        shape = (num_slots, num_kv_heads, max_len, head_dim)
        self.keys = tuple(torch.zeros(shape, dtype=dtype) for _ in range(num_layers))
        self.values = tuple(torch.zeros(shape, dtype=dtype) for _ in range(num_layers))
        self.block_size = block_size
        self._lane_base = lane_base
        self._slots = torch.arange(num_slots)  # append's row index (every decode writes every slot)
        # Host-side validity: positions held per slot (-1: nothing) and the page-table row they
        # were copied through.
        self._length = np.full(num_slots, -1, dtype=np.int64)
        self._table: np.ndarray | None = None

    def invalidate(self, slots: Iterable[int]) -> None:
        for s in slots:
            self._length[int(s)] = -1

    def plan(self, start: np.ndarray, table: np.ndarray) -> MirrorStep:
        """A decode step at ``start`` (int64 ``[B_wire]``, -1 = empty slot) through ``table`` (int64
        ``[B_wire, W]``, lane-local): which rows to refill, and the validity after the step (each
        active row holds ``[0, p]``)."""
        block_size = self.block_size
        if self._table is None or self._table.shape != table.shape:
            self._table = np.zeros_like(table)
            self._length[:] = -1
        active = start >= 0
        needed = (start + block_size - 1) // block_size  # blocks holding [0, p) per row
        cols = np.arange(table.shape[1])[None, :]
        moved = ((table != self._table) & (cols < needed[:, None])).any(axis=1)
        stale = active & ((self._length != start) | moved)
        stale &= start > 0  # a row at position 0 has nothing to copy
        self._length = np.where(active, start + 1, -1)
        self._table = np.where(active[:, None], table, self._table)
        rows = np.flatnonzero(stale)
        if rows.size == 0:
            return MirrorStep(None, None, 0, 0)
        refill_len = int(start[rows].max())
        num_blocks = -(-refill_len // block_size)
        blocks = (self._lane_base[rows, None] + table[rows, :num_blocks]).reshape(-1)
        return MirrorStep(torch.from_numpy(rows), torch.from_numpy(blocks), num_blocks, refill_len)

    def refill(self, layer: int, step: MirrorStep, store_keys: torch.Tensor, store_values: torch.Tensor) -> None:
        """Copy the refill rows' context from the store (``[blocks + 1, block_size, Hkv, D]``) into
        the mirror. Positions past a row's own length get whatever its page table's last block
        holds: finite values attention masks out, and never counted as held."""
        if step.refill_rows is None or step.refill_blocks is None:
            return
        k = len(step.refill_rows)
        for storage, mirror in ((store_keys, self.keys[layer]), (store_values, self.values[layer])):
            pages = storage.index_select(0, step.refill_blocks)  # [k * nb, block_size, Hkv, D]
            context = pages.view(k, -1, *storage.shape[2:]).transpose(1, 2)[:, :, : step.refill_len]
            mirror[step.refill_rows, :, : step.refill_len] = context

    def append(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write each slot's new ``k``/``v`` ``[B_wire, Hkv, D]`` at its position (int64 ``[B_wire]``,
        empty slots clamped to 0: their entries are invalid anyway)."""
        self.keys[layer][self._slots, :, positions] = k
        self.values[layer][self._slots, :, positions] = v
