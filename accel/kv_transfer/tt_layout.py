"""Converters between the canonical payload and the TT engine's paged KV.

TT layout (``accel/tt/mesh_model.py``): one lane's KV is ``[layer] = [K, V]``, each
``(num_blocks, num_kv_heads, block_size, head_dim)``; a request's lane-local page table
``block_ids`` lists its blocks in token order, token ``t`` at ``[block_ids[t // bs], :, t % bs]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

LaneKV = Sequence[Sequence[torch.Tensor]]  # [layer] = [K, V], each (num_blocks, Hkv, bs, D)


def gather_tt(lane_kv: LaneKV, block_ids: Sequence[int], num_tokens: int) -> torch.Tensor:
    """Copy the first ``num_tokens`` tokens out of the pages -> ``[L, 2, T, Hkv, D]``."""
    block_size = lane_kv[0][0].shape[2]
    _check_blocks(block_ids, num_tokens, block_size)
    index = torch.as_tensor(
        list(block_ids[: _num_blocks(num_tokens, block_size)]), dtype=torch.long, device=lane_kv[0][0].device
    )
    per_layer = []
    for key, value in lane_kv:
        kv = torch.stack((key[index], value[index]))  # [2, n, Hkv, bs, D]
        kv = kv.permute(0, 1, 3, 2, 4).reshape(2, -1, key.shape[1], key.shape[3])  # [2, n*bs, Hkv, D]
        per_layer.append(kv[:, :num_tokens])
    return torch.stack(per_layer)


def scatter_tt(lane_kv: LaneKV, block_ids: Sequence[int], kv: torch.Tensor, start_token: int = 0) -> None:
    """Write ``kv`` ``[L, 2, T, Hkv, D]`` into the pages as tokens ``start_token .. start_token+T``.

    Only those token slots are written; the rest of a partially filled last block is untouched.
    """
    num_layers, _, num_tokens = kv.shape[:3]
    if num_layers != len(lane_kv):
        raise ValueError(f"payload has {num_layers} layers, the engine {len(lane_kv)}")
    block_size = lane_kv[0][0].shape[2]
    end = start_token + num_tokens
    _check_blocks(block_ids, end, block_size)
    device = lane_kv[0][0].device
    positions = torch.arange(start_token, end, device=device)
    table = torch.as_tensor(list(block_ids), dtype=torch.long, device=device)
    blocks = table[positions // block_size]
    offsets = positions % block_size
    for layer, (key, value) in enumerate(lane_kv):
        key[blocks, :, offsets] = kv[layer, 0].to(device=device, dtype=key.dtype)
        value[blocks, :, offsets] = kv[layer, 1].to(device=device, dtype=value.dtype)


def _num_blocks(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def _check_blocks(block_ids: Sequence[int], num_tokens: int, block_size: int) -> None:
    if len(block_ids) < _num_blocks(num_tokens, block_size):
        raise ValueError(
            f"{num_tokens} tokens need {_num_blocks(num_tokens, block_size)} blocks of "
            f"{block_size}, the page table has {len(block_ids)}"
        )
