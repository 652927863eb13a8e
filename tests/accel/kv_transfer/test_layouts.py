"""Round trips between the TT paged layout, vLLM-CPU's block layout and the canonical format."""

import pytest
import torch

from accel.kv_transfer.tt_layout import gather_tt, scatter_tt
from accel.kv_transfer.vllm_layout import VllmCpuBlockLayout, gather_vllm, ordered_layers, scatter_vllm

L, H, D = 4, 2, 32


def _tt_lane(num_blocks=12, block_size=16):
    return [[torch.zeros(num_blocks, H, block_size, D), torch.zeros(num_blocks, H, block_size, D)] for _ in range(L)]


def _vllm_caches(num_blocks=8, block_size=32):
    return {f"model.layers.{i}.self_attn.attn": torch.zeros(num_blocks, H, block_size, 2 * D) for i in (2, 0, 3, 1)}


@pytest.mark.parametrize("num_tokens", [1, 16, 37, 70])
def test_tt_round_trip_is_exact(num_tokens):
    lane = _tt_lane()
    kv = torch.randn(L, 2, num_tokens, H, D)
    blocks = [7, 2, 9, 4, 11]
    scatter_tt(lane, blocks, kv)
    assert torch.equal(gather_tt(lane, blocks, num_tokens), kv)
    # token t landed at [blocks[t // bs], :, t % bs]
    t = num_tokens - 1
    assert torch.equal(lane[1][0][blocks[t // 16], :, t % 16], kv[1, 0, t])


def test_tt_scatter_leaves_other_slots_alone():
    lane = _tt_lane()
    for k, v in lane:
        k.fill_(5.0)
        v.fill_(5.0)
    kv = torch.randn(L, 2, 20, H, D)
    scatter_tt(lane, [3, 1], kv)
    assert bool((lane[0][0][1, :, 4:] == 5.0).all())  # tail of the partial block untouched
    assert bool((lane[0][0][0] == 5.0).all())


def test_tt_too_few_blocks_is_an_error():
    with pytest.raises(ValueError, match="need 2 blocks|page table has 1"):
        gather_tt(_tt_lane(), [1], 20)


@pytest.mark.parametrize("num_tokens", [1, 32, 45, 100])
def test_vllm_round_trip_is_exact(num_tokens):
    caches = _vllm_caches()
    layout = VllmCpuBlockLayout.vec(H, 32, D)
    kv = torch.randn(L, 2, num_tokens, H, D)
    blocks = [5, 1, 7, 3]
    scatter_vllm(caches, layout, blocks, kv)
    assert torch.equal(gather_vllm(caches, layout, blocks, num_tokens), kv)
    assert ordered_layers(caches)[0] == "model.layers.0.self_attn.attn"


def test_tt_to_vllm_to_tt_across_block_sizes():
    """TT blocks of 16 -> canonical -> vLLM blocks of 32 -> canonical -> TT: exact."""
    lane, caches = _tt_lane(), _vllm_caches()
    layout = VllmCpuBlockLayout.vec(H, 32, D)
    kv = torch.randn(L, 2, 53, H, D)
    scatter_tt(lane, [0, 5, 6, 2], kv)
    canonical = gather_tt(lane, [0, 5, 6, 2], 53)
    scatter_vllm(caches, layout, [6, 2], canonical)
    back = gather_vllm(caches, layout, [6, 2], 53)
    lane2 = _tt_lane()
    scatter_tt(lane2, [9, 8, 7, 6], back)
    assert torch.equal(gather_tt(lane2, [9, 8, 7, 6], 53), kv)


def test_vllm_scatter_with_offset_appends():
    caches = _vllm_caches()
    layout = VllmCpuBlockLayout.vec(H, 32, D)
    kv = torch.randn(L, 2, 50, H, D)
    scatter_vllm(caches, layout, [4, 2], kv[:, :, :20])
    scatter_vllm(caches, layout, [4, 2], kv[:, :, 20:], start_token=20)
    assert torch.equal(gather_vllm(caches, layout, [4, 2], 50), kv)


def test_vllm_layout_matches_vllms_own_write_op():
    """The probed layout equals the vec formula, and a cache written by vLLM's kernel reads back
    exactly (so attention in vLLM sees what we scatter)."""
    ops = pytest.importorskip("vllm._custom_ops")
    for block_size in (32, 128):
        probed = VllmCpuBlockLayout.probe(H, block_size, D, torch.float32, "vec")
        formula = VllmCpuBlockLayout.vec(H, block_size, D)
        assert torch.equal(probed.key_offsets, formula.key_offsets)
        assert torch.equal(probed.value_offsets, formula.value_offsets)
    bs, num_tokens = 32, 75
    cache = torch.zeros(4, H, bs, 2 * D)
    key, value = torch.randn(num_tokens, H, D), torch.randn(num_tokens, H, D)
    blocks = [3, 1, 2]
    slots = torch.tensor([blocks[t // bs] * bs + t % bs for t in range(num_tokens)])
    k_cache, v_cache = cache.view(4, H, 2 * bs, D).chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(key, value, k_cache, v_cache, slots, "vec")
    got = VllmCpuBlockLayout.vec(H, bs, D).gather(cache, blocks, num_tokens)
    assert torch.equal(got[0], key) and torch.equal(got[1], value)


def test_probe_handles_bfloat16_codes():
    pytest.importorskip("vllm._custom_ops")
    probed = VllmCpuBlockLayout.probe(H, 32, D, torch.bfloat16, "vec")
    assert torch.equal(probed.key_offsets, VllmCpuBlockLayout.vec(H, 32, D).key_offsets)
