"""Load an HF ``LlamaForCausalLM`` / ``Qwen3ForCausalLM`` safetensors checkpoint into fused tensors.

Reads ``model.safetensors`` or the shards listed in ``model.safetensors.index.json``. Tied
embeddings (no ``lm_head.weight``, or ``tie_word_embeddings``) reuse the embedding matrix (a
packed ``lm_head`` is its own oneDNN copy; the embedding lookup needs the dense one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from accel.tt.torch_model.config import DecoderConfig
from accel.tt.torch_model.layers import LayerWeights
from accel.tt.torch_model.linear import Linear, can_pack


@dataclass(frozen=True)
class ModelWeights:
    embed: torch.Tensor  # [vocab, hidden]
    layers: tuple[LayerWeights, ...]
    final_norm: torch.Tensor  # [hidden]
    lm_head: Linear  # [vocab, hidden] (the embedding's values when tied)


def checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / s for s in shards]
    single = model_dir / "model.safetensors"
    if not single.exists():
        raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {model_dir}")
    return [single]


def read_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
    return tensors


def load_weights(
    model_dir: str | Path,
    config: DecoderConfig,
    device: torch.device,
    dtype: torch.dtype,
    pack_linear: bool | None = None,
) -> ModelWeights:
    """``pack_linear``: oneDNN-packed projections (``linear.py``); None packs wherever ``can_pack``."""
    raw = read_tensors(Path(model_dir))
    pack = can_pack(device, dtype) if pack_linear is None else pack_linear

    def get(name: str) -> torch.Tensor:
        if name not in raw:
            raise KeyError(f"checkpoint {model_dir} lacks tensor {name!r}")
        return raw[name].to(device=device, dtype=dtype)

    def maybe(name: str) -> torch.Tensor | None:
        return get(name) if name in raw else None

    prefix = next((p for p in config.weight_prefixes if p + "embed_tokens.weight" in raw), "model.")
    layers = []
    for i in range(config.num_layers):
        p = f"{prefix}layers.{i}."
        biases = [maybe(p + f"self_attn.{n}_proj.bias") for n in "qkv"]
        qkv = torch.cat([get(p + f"self_attn.{n}_proj.weight") for n in "qkv"], dim=0)
        gate_up = torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")])
        layers.append(
            LayerWeights(
                input_norm=get(p + "input_layernorm.weight"),
                qkv=Linear.build(qkv, _qkv_bias(biases), pack=pack),
                o_proj=Linear.build(get(p + "self_attn.o_proj.weight"), pack=pack),
                q_norm=maybe(p + "self_attn.q_norm.weight") if config.has_qk_norm else None,
                k_norm=maybe(p + "self_attn.k_norm.weight") if config.has_qk_norm else None,
                post_attention_norm=get(p + "post_attention_layernorm.weight"),
                gate_up=Linear.build(gate_up, pack=pack),
                down=Linear.build(get(p + "mlp.down_proj.weight"), pack=pack),
            )
        )
    embed = get(prefix + "embed_tokens.weight")
    is_tied = config.tie_word_embeddings or "lm_head.weight" not in raw
    return ModelWeights(
        embed=embed,
        layers=tuple(layers),
        final_norm=get(prefix + "norm.weight"),
        lm_head=_lm_head(embed if is_tied else get("lm_head.weight"), is_tied, pack),
    )


def _lm_head(weight: torch.Tensor, is_tied: bool, pack: bool) -> Linear:
    if is_tied and not pack:
        # Dense and tied: the embedding matrix itself, row-major as the lookup needs it (F.linear's
        # transposed-B GEMM on it), not a second input-major copy.
        return Linear(weight.shape[0], weight.shape[1], weight, None, None)
    return Linear.build(weight, pack=pack)


def _qkv_bias(biases: list[torch.Tensor | None]) -> torch.Tensor | None:
    """The fused q/k/v bias when the checkpoint has all three (Qwen2-style), else None."""
    present = [b for b in biases if b is not None]
    return torch.cat(present).contiguous() if len(present) == len(biases) else None
