"""Paged KV: lane-local block ids address different memory per lane; padding writes go to scratch."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from accel.tt.torch_model.decode_mirror import DecodeMirror
from accel.tt.torch_model.paged_attention import (
    AttentionMetadata,
    PagedKVStore,
    mirrored_decode_attention,
    paged_attention,
    write_kv,
)


def test_same_block_id_in_two_lanes_is_different_memory():
    store = PagedKVStore.allocate(2, 1, (4, 1, 2, 4), torch.device("cpu"), torch.float32)
    table = torch.tensor([[3, 0], [3, 0]])
    positions = torch.tensor([[0, 1, 1], [0, 1, 1]])
    is_written = torch.tensor([[True, True, False], [True, True, False]])  # last token is padding
    meta = AttentionMetadata.build(store, table, torch.tensor([0, 1]), positions, is_written, 1)
    k = torch.arange(6 * 4, dtype=torch.float32).view(6, 1, 4)
    write_kv(store, 0, meta, k, -k)
    views = store.lane_views()
    assert torch.equal(views[0][0][0][3, 0], k[0:2, 0]) and torch.equal(views[1][0][0][3, 0], k[3:5, 0])
    assert torch.equal(views[1][0][1][3, 0], -k[3:5, 0])
    assert torch.count_nonzero(views[0][0][0][:3]) == 0  # nothing else written in lane 0
    assert torch.equal(store.keys[0][store.scratch_block, 0, 0], k[5, 0])  # padding -> scratch


def test_attention_is_causal_over_pages():
    torch.manual_seed(0)
    store = PagedKVStore.allocate(1, 1, (4, 2, 2, 8), torch.device("cpu"), torch.float32)
    n_tok = 3
    positions = torch.arange(n_tok)[None]
    meta = AttentionMetadata.build(
        store,
        torch.tensor([[2, 1]]),
        torch.tensor([0]),
        positions,
        torch.ones(1, n_tok, dtype=torch.bool),
        2,
        num_queries_per_kv=2,
    )
    q, k, v = torch.randn(n_tok, 4, 8), torch.randn(n_tok, 2, 8), torch.randn(n_tok, 2, 8)
    write_kv(store, 0, meta, k, v)
    out = paged_attention(store, 0, meta, q.view(1, n_tok, 4, 8), scale=8**-0.5).view(n_tok, 4, 8)
    # Reference: plain causal GQA attention (head h reads kv head h // 2).
    kk, vv = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = torch.einsum("thd,shd->hts", q, kk) * 8**-0.5
    scores = scores.masked_fill(torch.triu(torch.ones(n_tok, n_tok, dtype=torch.bool), 1), float("-inf"))
    ref = torch.einsum("hts,shd->thd", scores.softmax(-1), vv)
    assert torch.allclose(out, ref, atol=1e-5)


BS = 4
ENDS = [37, 3, 9, 1]  # keys visible per decode row (position + 1)


def _mixed_decode_step():
    """One long row, two short rows, one empty slot (position clamped to 0), random KV in random
    pages: (store, page table, positions [n, 1], metadata)."""
    torch.manual_seed(0)
    num_blocks = 16
    store = PagedKVStore.allocate(1, 1, (num_blocks, 2, BS, 8), torch.device("cpu"), torch.float32)
    for t in (store.keys[0], store.values[0]):
        t.copy_(torch.randn_like(t))
    table = torch.stack([torch.randperm(num_blocks) for _ in ENDS])
    positions = torch.tensor(ENDS)[:, None] - 1
    meta = AttentionMetadata.build(
        store,
        table,
        torch.zeros(len(ENDS), dtype=torch.int64),
        positions,
        torch.zeros(len(ENDS), 1, dtype=torch.bool),
        -(-max(ENDS) // BS),
        num_queries_per_kv=2,
        num_ctx_tokens=40,
    )
    return store, table, positions, meta


def test_decode_rows_read_only_their_own_context_and_match_full_attention():
    # Grouped decode reads per-group contexts; every row must equal attention over its whole
    # visible prefix.
    store, table, positions, meta = _mixed_decode_step()
    bs, ends = BS, ENDS
    assert meta.decode_groups is not None and len(meta.decode_groups) >= 2
    assert sorted(r for rows, _ in meta.decode_groups for r in rows.tolist()) == list(range(len(ends)))
    assert all(keys < 40 for rows, keys in meta.decode_groups if 0 not in rows.tolist())  # short rows read less
    q = torch.randn(len(ends), 1, 4, 8)
    out = paged_attention(store, 0, meta, q, scale=8**-0.5).view(len(ends), 4, 8)
    ungrouped = paged_attention(store, 0, dataclasses.replace(meta, decode_groups=None), q, scale=8**-0.5)
    assert torch.allclose(out, ungrouped.view(len(ends), 4, 8), atol=1e-5)
    for row, end in enumerate(ends):
        slots = torch.tensor([table[row, p // bs] * bs + p % bs for p in range(end)])
        kk = store.keys[0].view(-1, 2, 8)[slots].repeat_interleave(2, dim=1)  # [end, 4, 8]
        vv = store.values[0].view(-1, 2, 8)[slots].repeat_interleave(2, dim=1)
        ref = torch.einsum("hs,shd->hd", (torch.einsum("hd,shd->hs", q[row, 0], kk) * 8**-0.5).softmax(-1), vv)
        assert torch.allclose(out[row], ref, atol=1e-5)


def test_decode_rows_of_similar_context_keep_one_gather():
    store = PagedKVStore.allocate(1, 1, (8, 1, 4, 8), torch.device("cpu"), torch.float32)
    meta = AttentionMetadata.build(
        store,
        torch.zeros(3, 2, dtype=torch.int64),
        torch.zeros(3, dtype=torch.int64),
        torch.tensor([[5], [6], [7]]),
        torch.ones(3, 1, dtype=torch.bool),
        2,
    )
    assert meta.decode_groups is None


@pytest.mark.parametrize("grouped", [True, False])
def test_attention_over_the_decode_mirror_equals_attention_over_the_pages(grouped):
    """Refilled from the pages, the decode mirror gives every row the same attention as the page
    gather, per group or in one pass."""
    store, table, positions, meta = _mixed_decode_step()
    if not grouped:
        meta = dataclasses.replace(meta, decode_groups=None)
    mirror = DecodeMirror(1, 2, 64, 8, torch.float32, BS, np.zeros(len(ENDS), dtype=np.int64))
    # Every row refilled up to its position; the step's own token comes from append (its K/V
    # here are the pages' values at that position, as write_kv would have stored them).
    step = mirror.plan(positions[:, 0].numpy(), table.numpy())
    assert step.refill_rows is not None and step.refill_rows.tolist() == [0, 1, 2]  # position 0: nothing to copy
    mirror.refill(0, step, store.keys[0], store.values[0])
    flat_k, flat_v = store.keys[0].view(-1, 2, 8), store.values[0].view(-1, 2, 8)
    at = torch.tensor([table[r, p // BS] * BS + p % BS for r, p in enumerate(positions[:, 0].tolist())])
    mirror.append(0, positions[:, 0], flat_k[at], flat_v[at])
    q = torch.randn(len(ENDS), 1, 4, 8)
    expected = paged_attention(store, 0, meta, q, scale=8**-0.5)
    got = mirrored_decode_attention(mirror.keys[0], mirror.values[0], meta, q, scale=8**-0.5)
    assert torch.allclose(got, expected, atol=1e-6)
