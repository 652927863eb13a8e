"""Paged KV per lane, addressed by lane-local page tables, and attention over it.

Storage: one tensor per layer and K/V, ``[num_lanes * num_blocks + 1, block_size, Hkv, D]``. Lane
``l`` owns blocks ``[l * num_blocks, (l + 1) * num_blocks)``; the engine sees each lane's slice as
its own ``(num_blocks, Hkv, block_size, D)`` tensor (``kv[lane][layer] == [K, V]``, a permuted
view), so a block id in a page table is lane-local exactly as on a mesh. Token-major blocks make
the gathered context ``[n, C, Hkv, D]`` a free view for attention (no per-step transpose copy). The
one extra block at the end is a scratch sink: tokens that must not write KV (padding, empty decode
slots) write there, which keeps every
write a fixed-shape scatter (what a captured program needs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class PagedKVStore:
    keys: tuple[torch.Tensor, ...]  # per layer [num_lanes * num_blocks + 1, block_size, Hkv, D]
    values: tuple[torch.Tensor, ...]
    num_lanes: int
    num_blocks: int  # per lane
    block_size: int

    @staticmethod
    def allocate(
        num_lanes: int,
        num_layers: int,
        block_shape: tuple[int, int, int, int],
        device: torch.device,
        dtype: torch.dtype,
    ) -> PagedKVStore:
        num_blocks, num_kv_heads, block_size, head_dim = block_shape
        shape = (num_lanes * num_blocks + 1, block_size, num_kv_heads, head_dim)
        keys = tuple(torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers))
        values = tuple(torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers))
        return PagedKVStore(keys, values, num_lanes, num_blocks, block_size)

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    @property
    def scratch_block(self) -> int:
        return self.num_lanes * self.num_blocks

    def lane_views(self) -> list[list[list[torch.Tensor]]]:
        """``[lane][layer] = [K, V]``, each a view ``(num_blocks, Hkv, block_size, D)``."""
        nb = self.num_blocks

        def view(t: torch.Tensor, lane: int) -> torch.Tensor:
            return t[lane * nb : (lane + 1) * nb].permute(0, 2, 1, 3)

        return [
            [[view(k, lane), view(v, lane)] for k, v in zip(self.keys, self.values)] for lane in range(self.num_lanes)
        ]

    def is_backing(self, kv_cache: Any) -> bool:
        """True if ``kv_cache`` (``[lane][layer] = [K, V]``) is a view of this store."""
        try:
            first = kv_cache[0][0][0]
            return (
                len(kv_cache) == self.num_lanes
                and len(kv_cache[0]) == len(self.keys)
                and first.data_ptr() == self.keys[0].data_ptr()
            )
        except (TypeError, IndexError, AttributeError):
            return False


@dataclass(frozen=True)
class AttentionMetadata:
    """Where a step's tokens write and what they may read; built once per forward, used by every layer.

    ``n`` rows x ``L`` padded tokens per row; ``C`` keys per row: the first ``num_ctx_tokens`` of
    the ``num_ctx_blocks * block_size`` gathered (attention cost is linear in ``C``).
    """

    write_slots: torch.Tensor  # int64 [n * L], token slot (block * block_size + offset); scratch if no write
    ctx_blocks: torch.Tensor  # int64 [n * num_ctx_blocks], global block ids, row-major
    num_ctx_blocks: int
    num_ctx_tokens: int
    mask: torch.Tensor  # float [n, 1, G * L, C]: 0 where key j is visible (j <= position), -inf elsewhere
    # Decode only, when rows' contexts differ a lot: (row indices int64 [k], keys to read) per group
    # of rows whose own context rounds to the same power-of-two block count. A paged-SDPA decode
    # kernel reads each row's own pages; reading the longest row's context for every slot made one
    # long-context request cost every slot its length (16 slots x 1800 keys gathered per layer).
    decode_groups: tuple[tuple[torch.Tensor, int], ...] | None = None

    @staticmethod
    def build(
        store: PagedKVStore,
        page_table: torch.Tensor,
        lanes: torch.Tensor,
        positions: torch.Tensor,
        is_written: torch.Tensor,
        num_ctx_blocks: int,
        num_queries_per_kv: int = 1,
        dtype: torch.dtype = torch.float32,
        num_ctx_tokens: int | None = None,
    ) -> AttentionMetadata:
        """``page_table`` int ``[n, W]`` lane-local; ``lanes`` int64 ``[n]``; ``positions`` int64
        ``[n, L]`` (every entry a valid position, padding clamped); ``is_written`` bool ``[n, L]``;
        ``num_ctx_tokens`` (default: every gathered token) must exceed the largest position."""
        bs = store.block_size
        base = (lanes * store.num_blocks)[:, None]
        table = page_table.to(torch.int64)
        local_block = torch.gather(table, 1, torch.div(positions, bs, rounding_mode="floor"))
        write_slots = torch.where(is_written, (base + local_block) * bs + positions % bs, store.scratch_block * bs)
        ctx_blocks = base + table[:, :num_ctx_blocks]
        num_ctx_tokens = num_ctx_blocks * bs if num_ctx_tokens is None else min(num_ctx_tokens, num_ctx_blocks * bs)
        keys_pos = torch.arange(num_ctx_tokens, device=positions.device)
        n, length = positions.shape
        # Additive mask (what SDPA turns a bool mask into anyway; passing it ready is cheaper).
        # Every query sees key 0, so no row is fully masked.
        hidden = (keys_pos[None, None, :] > positions[:, :, None])[:, None]  # [n, 1, L, C]
        mask = torch.zeros(hidden.shape, dtype=dtype, device=positions.device).masked_fill_(hidden, float("-inf"))
        if num_queries_per_kv > 1:
            mask = mask.expand(n, num_queries_per_kv, length, mask.shape[-1])
        mask = mask.reshape(n, 1, num_queries_per_kv * length, -1)
        groups = _decode_groups(positions, bs, num_ctx_blocks, num_ctx_tokens) if length == 1 else None
        return AttentionMetadata(
            write_slots.reshape(-1), ctx_blocks.reshape(-1), num_ctx_blocks, num_ctx_tokens, mask, groups
        )


def _decode_groups(
    positions: torch.Tensor, block_size: int, num_ctx_blocks: int, num_ctx_tokens: int
) -> tuple[tuple[torch.Tensor, int], ...] | None:
    """Rows grouped by their own context (``position + 1`` keys, rounded up to a power-of-two
    block count, at most the step's); None when one group would read (nearly) everything anyway.
    Keys past a row's position are masked, so reading fewer of them never changes its output."""
    by_blocks: dict[int, list[int]] = {}
    for row, pos in enumerate(positions[:, 0].tolist()):
        need = -(-(pos + 1) // block_size)
        by_blocks.setdefault(min(num_ctx_blocks, 1 << (need - 1).bit_length()), []).append(row)
    if len(by_blocks) < 2:
        return None
    return tuple(
        (torch.tensor(rows, dtype=torch.int64, device=positions.device), min(num_blocks * block_size, num_ctx_tokens))
        for num_blocks, rows in sorted(by_blocks.items())
    )


def write_kv(store: PagedKVStore, layer: int, meta: AttentionMetadata, k: torch.Tensor, v: torch.Tensor) -> None:
    """Scatter ``k``/``v`` ``[n * L, Hkv, D]`` into their token slots (fixed shape, no host sync)."""
    for storage, new in ((store.keys[layer], k), (store.values[layer], v)):
        storage.view(-1, *storage.shape[2:]).index_copy_(0, meta.write_slots, new)


def paged_attention(
    store: PagedKVStore, layer: int, meta: AttentionMetadata, q: torch.Tensor, scale: float
) -> torch.Tensor:
    """``q`` ``[n, L, H, D]`` over each row's pages -> ``[n, L, H * D]`` (GQA: head h reads kv h // G)."""
    n, length, num_heads, head_dim = q.shape
    keys, values = store.keys[layer], store.values[layer]
    if meta.decode_groups is not None:
        # Each group gathers only its rows' first ``num_keys`` keys.
        table = meta.ctx_blocks.view(n, meta.num_ctx_blocks)

        def group_kv(rows: torch.Tensor, num_keys: int) -> tuple[torch.Tensor, torch.Tensor]:
            blocks = table.index_select(0, rows)[:, : -(-num_keys // store.block_size)].reshape(-1)
            k, v = (_gather(t, blocks, len(rows))[:, :, :num_keys] for t in (keys, values))
            return k, v

        return _grouped_decode_attention(meta, q, scale, group_kv)
    k = _gather(keys, meta.ctx_blocks, n)[:, :, : meta.num_ctx_tokens]  # [n, Hkv, C, D]
    v = _gather(values, meta.ctx_blocks, n)[:, :, : meta.num_ctx_tokens]
    if length == 1:
        return _decode_attention(q, k, v, meta.mask, scale)
    num_kv = k.shape[1]
    group = num_heads // num_kv
    # Queries of one kv head side by side: [n, Hkv, G * L, D]; the mask repeats per group.
    qg = q.view(n, length, num_kv, group, head_dim).permute(0, 2, 3, 1, 4).reshape(n, num_kv, group * length, head_dim)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=meta.mask, scale=scale)
    return out.view(n, num_kv, group, length, head_dim).permute(0, 3, 1, 2, 4).reshape(n, length, num_heads * head_dim)


def mirrored_decode_attention(
    keys: torch.Tensor, values: torch.Tensor, meta: AttentionMetadata, q: torch.Tensor, scale: float
) -> torch.Tensor:
    """Decode attention over the slots' contiguous contexts (one layer of a ``DecodeMirror``:
    ``keys``/``values`` ``[B_wire, Hkv, max_len, D]``): ``q`` ``[B_wire, 1, H, D]`` -> ``[B_wire, 1,
    H * D]``. Every slot reads the step's ``num_ctx_tokens`` keys (a view, no copy) unless the rows'
    contexts differ enough that copying each group's own keys and attending per group costs less
    (copying a key costs about as much as attending to it)."""
    num_ctx, groups = meta.num_ctx_tokens, meta.decode_groups
    if groups is None or 2 * sum(len(rows) * num_keys for rows, num_keys in groups) >= q.shape[0] * num_ctx:
        return _decode_attention(q, keys[:, :, :num_ctx], values[:, :, :num_ctx], meta.mask, scale)

    def group_kv(rows: torch.Tensor, num_keys: int) -> tuple[torch.Tensor, torch.Tensor]:
        return keys[:, :, :num_keys].index_select(0, rows), values[:, :, :num_keys].index_select(0, rows)

    return _grouped_decode_attention(meta, q, scale, group_kv)


def _decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """``q`` ``[n, 1, H, D]`` over ``k``/``v`` ``[n, Hkv, C, D]`` -> ``[n, 1, H * D]``: a head's
    group of queries is already contiguous, so views only."""
    n, _, num_heads, head_dim = q.shape
    num_kv = k.shape[1]
    out = F.scaled_dot_product_attention(
        q.view(n, num_kv, num_heads // num_kv, head_dim), k, v, attn_mask=mask, scale=scale
    )
    return out.reshape(n, 1, num_heads * head_dim)


def _grouped_decode_attention(
    meta: AttentionMetadata,
    q: torch.Tensor,
    scale: float,
    group_kv: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """Decode attention per ``meta.decode_groups``: ``group_kv(rows, num_keys)`` gives the group's
    ``[len(rows), Hkv, num_keys, D]`` keys and values (``q`` ``[n, 1, H, D]`` -> ``[n, 1, H * D]``)."""
    assert meta.decode_groups is not None
    n, _, num_heads, head_dim = q.shape
    out = q.new_empty(n, 1, num_heads * head_dim)
    for rows, num_keys in meta.decode_groups:
        k, v = group_kv(rows, num_keys)
        mask = meta.mask.index_select(0, rows)[..., :num_keys]
        out.index_copy_(0, rows, _decode_attention(q.index_select(0, rows), k, v, mask, scale))
    return out


def _gather(storage: torch.Tensor, blocks: torch.Tensor, n: int) -> torch.Tensor:
    """Pages of ``blocks`` ``[n * Cb]`` as ``[n, Hkv, Cb * block_size, D]`` (a strided view of one copy)."""
    _, block_size, num_kv, head_dim = storage.shape
    pages = storage.index_select(0, blocks)  # row copies: faster than 2-D advanced indexing
    return pages.view(n, -1, num_kv, head_dim).transpose(1, 2)


def num_ctx_blocks(max_end: int, store: PagedKVStore, table_width: int) -> int:
    """Blocks of context a step reads (its longest row's, ``max_end`` tokens). Like a paged-SDPA
    kernel, only those are read; the fixed shapes a trace needs are the decode width and prefill
    buckets."""
    needed = max(1, -(-max_end // store.block_size))
    if needed > table_width:
        raise ValueError(f"page table width {table_width} < {needed} blocks needed for {max_end} tokens")
    return needed


def check_block_ids(page_table: np.ndarray, ends: np.ndarray, store: PagedKVStore) -> None:
    """Every block a row reads or writes (its first ``ceil(end / block_size)``) must be a lane-local
    id; anything else would address another lane's memory. Rows with ``end <= 0`` read nothing.
    Host arrays (``page_table`` ``[rows, width]``, ``ends`` ``[rows]``): it runs on the caller's
    thread, where torch ops would give up the GIL (``accel.tt.host_arrays``)."""
    num_used = (ends + store.block_size - 1) // store.block_size  # [rows]
    used = np.arange(page_table.shape[1])[None, :] < num_used[:, None]
    bad = used & ((page_table < 0) | (page_table >= store.num_blocks))
    if bad.any():
        row = int(np.flatnonzero(bad.any(axis=1))[0])
        raise ValueError(
            f"page table row {row} holds block ids outside [0, {store.num_blocks}): "
            f"{page_table[row, : int(num_used[row])].tolist()}"
        )
