"""The decoder shape the torch mesh program is built for, read once from an HF config.

Only what the forward needs: dimensions, norm eps, RoPE parameters (HF ``rope_parameters``, with the
legacy ``rope_theta``/``rope_scaling`` spelling accepted), tied embeddings and q/k norm.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Architectures this torch implementation computes exactly like HF transformers.
TORCH_ARCHITECTURES = ("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen2_5_VLForConditionalGeneration")
# Vision-language architectures: the decoder is the nested text model. Checkpoints keep its
# tensors under ``model.`` (the published Qwen2.5-VL ones, and transformers 5's save) or
# ``model.language_model.`` (transformers' module names).
LANGUAGE_MODEL_PREFIXES = {"Qwen2_5_VLForConditionalGeneration": ("model.", "model.language_model.")}


@dataclass(frozen=True)
class DecoderConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    has_qk_norm: bool  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    has_attention_bias: bool
    rope_parameters: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def weight_prefixes(self) -> tuple[str, ...]:
        """Where the decoder's tensors may sit in the checkpoint (``model.layers.0...`` for a text model)."""
        return LANGUAGE_MODEL_PREFIXES.get(self.architecture, ("model.",))

    @property
    def rope_theta(self) -> float:
        return float(self.rope_parameters.get("rope_theta", 10000.0))

    @staticmethod
    def from_hf(hf_config: Any, n_layers: int | None = None) -> DecoderConfig:
        archs = list(getattr(hf_config, "architectures", None) or [])
        arch = next((a for a in archs if a in TORCH_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(f"torch mesh model supports {TORCH_ARCHITECTURES}, got architectures={archs}")
        if arch in LANGUAGE_MODEL_PREFIXES:
            hf_config = hf_config.get_text_config()
        num_heads = int(hf_config.num_attention_heads)
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
        num_layers = int(hf_config.num_hidden_layers)
        if n_layers is not None:
            num_layers = min(num_layers, int(n_layers))
        return DecoderConfig(
            architecture=arch,
            vocab_size=int(hf_config.vocab_size),
            hidden_size=int(hf_config.hidden_size),
            intermediate_size=int(hf_config.intermediate_size),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=int(getattr(hf_config, "num_key_value_heads", None) or num_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(hf_config.rms_norm_eps),
            max_position_embeddings=int(hf_config.max_position_embeddings),
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            has_qk_norm=arch == "Qwen3ForCausalLM",
            has_attention_bias=bool(getattr(hf_config, "attention_bias", False)),
            rope_parameters=_rope_parameters(hf_config),
        )


def _rope_parameters(hf_config: Any) -> dict[str, Any]:
    params = getattr(hf_config, "rope_parameters", None)
    if params is None:  # transformers < 5 spelling
        params = dict(getattr(hf_config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    params = dict(params)
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    return params
