"""Tiny LoRA adapters for the tiny Llama, offline: ``python -m accel.models.tiny_lora [OUT_DIR]``.

Writes ``OUT_DIR/tiny-llama-lora-a`` and ``OUT_DIR/tiny-llama-lora-b``: PEFT-format adapters
(``adapter_config.json`` + ``adapter_model.safetensors``, the files ``vllm serve --lora-modules``
and vLLM's ``LoRARequest`` load) of rank 8 on every layer's ``q_proj``, ``v_proj`` and
``o_proj``, seeded, byte-identical across runs. Their weights are large enough that greedy output
differs from the base model's and between the two adapters (what routing and caching tests need).

The tensor names are PEFT's: ``base_model.model.<module path>.lora_A.weight`` ``[r, in]`` and
``...lora_B.weight`` ``[out, r]``; the update is ``W + (lora_alpha / r) * B @ A``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from accel import envs

BASE = "tiny-llama"
RANK = 8
ALPHA = 16
TARGETS = ("q_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class AdapterSpec:
    name: str
    seed: int


ADAPTERS = (AdapterSpec("tiny-llama-lora-a", 11), AdapterSpec("tiny-llama-lora-b", 23))


def _shapes(config: dict[str, int]) -> dict[str, tuple[int, int]]:
    """(out, in) of each target projection of the tiny Llama."""
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    return {
        "q_proj": (config["num_attention_heads"] * head_dim, hidden),
        "v_proj": (config["num_key_value_heads"] * head_dim, hidden),
        "o_proj": (hidden, config["num_attention_heads"] * head_dim),
    }


def write_adapter(spec: AdapterSpec, base_dir: Path, out_dir: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    config = json.loads((base_dir / "config.json").read_text(encoding="utf-8"))
    shapes = _shapes(config)
    generator = torch.Generator().manual_seed(spec.seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(config["num_hidden_layers"]):
        for target in TARGETS:
            out_features, in_features = shapes[target]
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            # A spread of ~1/sqrt(in) and B of 0.5: a low-rank update comparable to the tiny
            # model's own (deliberately peaked) weights, so the adapter changes greedy choices.
            a = torch.randn(RANK, in_features, generator=generator) / in_features**0.5
            b = torch.randn(out_features, RANK, generator=generator) * 0.5
            tensors[f"{prefix}.lora_A.weight"] = a.contiguous()
            tensors[f"{prefix}.lora_B.weight"] = b.contiguous()
    path = out_dir / spec.name
    path.mkdir(parents=True, exist_ok=True)
    save_file(dict(sorted(tensors.items())), str(path / "adapter_model.safetensors"))
    adapter_config = {
        "base_model_name_or_path": BASE,
        "bias": "none",
        "fan_in_fan_out": False,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "peft_type": "LORA",
        "r": RANK,
        "target_modules": list(TARGETS),
        "task_type": "CAUSAL_LM",
    }
    (path / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    return path


def ensure_adapters(checkpoint_dir: Path) -> list[Path]:
    """Build the adapters beside the tiny Llama unless they are there (the base must exist)."""
    base = checkpoint_dir / BASE
    paths = [checkpoint_dir / spec.name for spec in ADAPTERS]
    if all((p / "adapter_model.safetensors").is_file() and (p / "adapter_config.json").is_file() for p in paths):
        return paths
    return [write_adapter(spec, base, checkpoint_dir) for spec in ADAPTERS]


def main(argv: list[str] | None = None) -> int:
    default_dir = envs.ENVS.checkpoint_dir
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "out_dir", nargs="?", default=str(default_dir), help=f"checkpoint folder (default: {default_dir})"
    )
    args = parser.parse_args(argv)
    for path in ensure_adapters(Path(args.out_dir).expanduser()):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
