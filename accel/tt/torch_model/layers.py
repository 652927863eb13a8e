"""Decoder building blocks, computed the way HF transformers computes them for Llama and Qwen3.

Pure functions over weight tensors (no nn.Module state), so the mesh program in ``model.py`` reads
top to bottom: RMSNorm, rotary embedding (default / linear / llama3 scaling from
``rope_parameters``), the q/k/v projections with optional per-head q/k norm, and the SwiGLU MLP.
Tensor shapes: ``T`` = tokens in the step (rows x padded length, flattened), ``H``/``Hkv`` = query /
kv heads, ``D`` = head_dim.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from accel.tt.torch_model.config import DecoderConfig
from accel.tt.torch_model.linear import Linear


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        # One op instead of six, same arithmetic: x * rsqrt(mean(x^2) + eps) * weight.
        return torch.rms_norm(x, weight.shape, weight, eps)
    # HF computes the statistic in fp32 and casts back before scaling.
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rope_inv_freq(config: DecoderConfig) -> torch.Tensor:
    """Inverse frequencies ``[D/2]`` (fp32) incl. the scaling named by ``rope_parameters``."""
    params = config.rope_parameters
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(params["factor"])
    if rope_type == "llama3":
        return _llama3_scale(inv_freq, params)
    raise ValueError(f"rope_type {rope_type!r} is not implemented by the torch mesh model")


def _llama3_scale(inv_freq: torch.Tensor, params: Mapping[str, Any]) -> torch.Tensor:
    factor = float(params["factor"])
    low_freq_factor = float(params["low_freq_factor"])
    high_freq_factor = float(params["high_freq_factor"])
    old_context_len = float(params["original_max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are divided by factor, short ones kept, the band between interpolated.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


@dataclass(frozen=True)
class RotaryTables:
    """cos/sin for every position ``[max_positions, D]``, precomputed once (fp32, on device)."""

    cos: torch.Tensor
    sin: torch.Tensor
    signed_sin: torch.Tensor  # sin with its first half negated (see apply_rotary_rolled)

    @staticmethod
    def build(config: DecoderConfig, max_positions: int, device: torch.device, dtype: torch.dtype) -> RotaryTables:
        inv_freq = rope_inv_freq(config)
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(device=device, dtype=dtype), emb.sin().to(device=device, dtype=dtype)
        half = sin.shape[-1] // 2
        return RotaryTables(cos, sin, torch.cat((-sin[:, :half], sin[:, half:]), dim=-1))

    def at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[T, 1, D]`` for ``positions`` ``[T]``."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]

    def at_rolled(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin ``[T, 1, D]`` for ``apply_rotary_rolled`` (looked up once per forward)."""
        return self.cos[positions][:, None, :], self.signed_sin[positions][:, None, :]

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return apply_rotary(x, *self.at(positions))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` ``[T, heads, D]`` rotated (rotate-half convention, as HF) by ``cos``/``sin`` ``[T, 1, D]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def apply_rotary_rolled(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """``apply_rotary`` with ``signed_sin`` from ``RotaryTables.at_rolled``: ``rotate_half(x) * sin``
    equals ``roll(x, D/2) * signed_sin`` element for element (a sign flip is exact), in 4 ops not 7."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer; q/k/v and gate/up are fused along the output dim for fewer matmuls.
    Projections are ``Linear`` layers (HF's ``[out, in]`` weights, oneDNN-packed on CPU)."""

    input_norm: torch.Tensor  # [hidden]
    qkv: Linear  # [(H + 2*Hkv) * D, hidden], with the fused q/k/v bias when the checkpoint has one
    o_proj: Linear  # [hidden, H * D]
    q_norm: torch.Tensor | None  # [D] (Qwen3)
    k_norm: torch.Tensor | None  # [D]
    post_attention_norm: torch.Tensor  # [hidden]
    gate_up: Linear  # [2 * intermediate, hidden]
    down: Linear  # [hidden, intermediate]


def project_qkv(
    h: torch.Tensor, layer: LayerWeights, config: DecoderConfig, cos_sin: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``h`` ``[T, hidden]`` -> q ``[T, H, D]``, k and v ``[T, Hkv, D]`` (q/k normed and rotated).
    ``cos_sin`` from ``RotaryTables.at_rolled``."""
    num_heads, num_kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
    qkv = layer.qkv(h).view(-1, num_heads + 2 * num_kv_heads, head_dim)
    v = qkv[:, num_heads + num_kv_heads :]
    if layer.q_norm is not None:
        assert layer.k_norm is not None  # q/k norm checkpoints (Qwen3) carry both
        q = rms_norm(qkv[:, :num_heads], layer.q_norm, config.rms_norm_eps)
        k = rms_norm(qkv[:, num_heads : num_heads + num_kv_heads], layer.k_norm, config.rms_norm_eps)
        return apply_rotary_rolled(q, *cos_sin), apply_rotary_rolled(k, *cos_sin), v
    # No q/k norm: q and k heads sit side by side, so one rotation covers both (same per-element
    # arithmetic as rotating each, half the ops).
    qk = apply_rotary_rolled(qkv[:, : num_heads + num_kv_heads], *cos_sin)
    return qk[:, :num_heads], qk[:, num_heads:], v


def swiglu_mlp(h: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
    # In place on the fused projection's gate half (no two [T, intermediate] temporaries; a big
    # prefill's are MBs each); the down GEMM reads that strided half as is (leading dim 2I).
    gate, up = layer.gate_up(h).chunk(2, dim=-1)
    return layer.down(F.silu(gate, inplace=True).mul_(up))
