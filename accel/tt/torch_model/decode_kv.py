"""Decode-resident KV: each decode slot's context kept contiguous beside the paged store.

Why: a paged-SDPA decode kernel (tt-metal's, vLLM's CPU one) reads each row's pages where they
lie. Torch has no such kernel, so the paged path copies every row's pages into one tensor per
layer and K/V on every decode step (``paged_attention._gather``): 16 MB per step for 32 rows of
~200 tokens of tiny-llama, read back once more by SDPA; on a shared CPU that copy cost more than
all the decode GEMMs together. Here each slot's K/V also live in ``[slots, Hkv, cap, D]`` rows
that decode appends to, so attention reads them in place.

The pages stay the source of truth (every write goes to them too: the engine's KV hooks read and
write them through ``allocate_kv_cache``'s views). Invariant: for a slot with ``valid[s] == p``,
positions ``[0, p)`` of its row equal its pages under the global block ids ``table[s]``. A
slot's pages change only through this program: prefill of that slot (which ``invalidate``s it)
or its own decode (which appends). Before a decode step ``sync`` refills, from the pages, any
row whose ``valid`` is not its position or whose used page-table entries changed, so a new,
preempted-and-resumed or imported request reads exactly what the paged path would.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from accel.tt.torch_model.paged_attention import AttentionMetadata, PagedKVStore

# Rows grow in steps of this many tokens (fewer reallocations; shapes stay few).
CAPACITY_STEP_TOKENS = 256
# Above this many bytes (every layer, K and V) the program keeps the paged path: the rows are a
# second copy of every running slot's context.
MAX_RESIDENT_BYTES = 1 << 30


class DecodeKV:
    def __init__(self, store: PagedKVStore, num_slots: int, max_seq_len: int) -> None:
        self.store = store
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        _, self.block_size, self.num_kv_heads, self.head_dim = store.keys[0].shape
        self.capacity = 0
        self.keys: list[torch.Tensor] = []  # per layer [slots, Hkv, capacity, D]
        self.values: list[torch.Tensor] = []
        device = store.keys[0].device
        self.valid = torch.full((num_slots,), -1, dtype=torch.int64, device=device)
        self.table = torch.full((num_slots, 0), -1, dtype=torch.int64, device=device)

    def bytes_for(self, capacity: int) -> int:
        elem = self.store.keys[0].element_size()
        return 2 * len(self.store.keys) * self.num_slots * self.num_kv_heads * capacity * self.head_dim * elem

    def invalidate(self, slots: torch.Tensor) -> None:
        """``slots`` (int64) had KV written by a prefill: refill before their next decode."""
        self.valid[slots] = -1

    def sync(self, table: torch.Tensor, start_pos: torch.Tensor, num_ctx_tokens: int) -> bool:
        """Make every decoding row (``start_pos >= 0``) hold its ``[0, start_pos)`` context and
        room for ``num_ctx_tokens`` keys. ``table`` int64 ``[slots, W]`` global block ids.
        False: the rows would pass ``MAX_RESIDENT_BYTES`` (use the paged path this step)."""
        if not self._ensure_capacity(max(num_ctx_tokens, 1)):  # empty slots write position 0
            return False
        if self.table.shape[1] != table.shape[1]:
            self.table = torch.full_like(table, -1)
            self.valid.fill_(-1)
        bs = self.block_size
        decoding = start_pos >= 0
        num_used = (start_pos + bs - 1).div(bs, rounding_mode="floor")  # blocks holding [0, start_pos)
        used = torch.arange(table.shape[1], device=table.device)[None, :] < num_used[:, None]
        moved = ((table != self.table) & used).any(dim=1)
        stale = decoding & ((self.valid != start_pos) | moved)
        if bool(stale.any()):
            for row in stale.nonzero().flatten().tolist():
                self._refill(row, table[row], int(start_pos[row]))
        self.table = torch.where(decoding[:, None], table, self.table)
        return True

    def advance(self, start_pos: torch.Tensor) -> None:
        """After a decode step wrote position ``start_pos`` of every decoding row. Empty slots
        (-1) wrote garbage at their position 0: they are refilled before they decode again."""
        self.valid = torch.where(start_pos >= 0, start_pos + 1, -1)

    def write(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """``k``/``v`` ``[slots, Hkv, D]`` of a full-width decode at ``positions`` int64 ``[slots]``."""
        rows = torch.arange(self.num_slots, device=positions.device)
        self.keys[layer][rows, :, positions] = k
        self.values[layer][rows, :, positions] = v

    def context(self, layer: int, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V ``[slots, Hkv, num_tokens, D]`` (views)."""
        return self.keys[layer][:, :, :num_tokens], self.values[layer][:, :, :num_tokens]

    def _ensure_capacity(self, num_tokens: int) -> bool:
        if num_tokens <= self.capacity:
            return True
        step = CAPACITY_STEP_TOKENS
        capacity = min(-(-num_tokens // step) * step, max(self.max_seq_len, num_tokens))
        if self.bytes_for(capacity) > MAX_RESIDENT_BYTES:
            return False
        shape = (self.num_slots, self.num_kv_heads, capacity, self.head_dim)
        store = self.store
        old_k, old_v, old_cap = self.keys, self.values, self.capacity
        self.keys = [torch.zeros(shape, dtype=t.dtype, device=t.device) for t in store.keys]
        self.values = [torch.zeros(shape, dtype=t.dtype, device=t.device) for t in store.values]
        for new, old in zip(self.keys + self.values, old_k + old_v):
            new[:, :, :old_cap] = old
        self.capacity = capacity
        return True

    def _refill(self, row: int, table_row: torch.Tensor, num_tokens: int) -> None:
        """Copy positions ``[0, num_tokens)`` of ``row`` from its pages."""
        if num_tokens > 0:
            blocks = table_row[: -(-num_tokens // self.block_size)]
            for rows, pages in zip(self.keys + self.values, self.store.keys + self.store.values):
                ctx = pages.index_select(0, blocks).view(-1, self.num_kv_heads, self.head_dim)[:num_tokens]
                rows[row, :, :num_tokens] = ctx.transpose(0, 1)
        self.valid[row] = num_tokens


def resident_attention(
    resident: DecodeKV, layer: int, meta: AttentionMetadata, q: torch.Tensor, scale: float
) -> torch.Tensor:
    """Decode attention over the resident rows (``paged_attention``'s decode path without the
    page copy): ``q`` ``[slots, 1, H, D]`` -> ``[slots, 1, H * D]``; rows grouped by context
    length as ``meta.decode_groups`` says."""
    n, _, num_heads, head_dim = q.shape
    num_kv = resident.num_kv_heads
    group = num_heads // num_kv
    if meta.decode_groups is None:
        k, v = resident.context(layer, meta.num_ctx_tokens)
        out = F.scaled_dot_product_attention(q.view(n, num_kv, group, head_dim), k, v, attn_mask=meta.mask, scale=scale)
        return out.reshape(n, 1, num_heads * head_dim)
    out = q.new_empty(n, 1, num_heads * head_dim)
    for rows, num_keys in meta.decode_groups:
        k, v = resident.context(layer, num_keys)
        o = F.scaled_dot_product_attention(
            q.index_select(0, rows).view(len(rows), num_kv, group, head_dim),
            k.index_select(0, rows),
            v.index_select(0, rows),
            attn_mask=meta.mask.index_select(0, rows)[..., :num_keys],
            scale=scale,
        )
        out.index_copy_(0, rows, o.reshape(len(rows), 1, num_heads * head_dim))
    return out
