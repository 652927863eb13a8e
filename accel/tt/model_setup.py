"""Building a mesh model for the TT engine: HF config, backend, model instance, KV sizing.

Everything here runs once, at engine construction; the step loop never calls it. Section
numbers (§3) refer to the project's tt-mesh-engine reference notes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accel.contract import ConfigError
from accel.tt.backend import load_mesh_model, open_backend
from accel.tt.config import TTEngineConfig
from accel.tt.mesh_device import MeshDeviceConfig
from accel.tt.mesh_model import SUPPORTS_CHUNKED_PREFILL, MeshModel
from accel.tt.registry import BACKEND_TORCH, BACKEND_TTNN, folds_dp_into_lanes


def load_hf_config(model: str) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model, local_files_only=True)


def text_config(hf_config: Any) -> Any:
    """The language model's config: a vision-language checkpoint nests it (``text_config``, with
    the vocabulary, layers and heads); a text checkpoint is its own."""
    get = getattr(hf_config, "get_text_config", None)
    return hf_config if get is None else get()


def open_default_backend(config: TTEngineConfig, accelerator: str = "cpu") -> Any:
    """``accelerator`` "tt": the ttnn mesh (opened with ``additional_config.tt``'s device
    options) or ``NoTenstorrentDevice`` naming what is missing (ttnn not importable, no chips,
    a mesh larger than the visible chips) -- never a silent fallback to the host. "cpu" /
    "cuda": the torch program."""
    if accelerator == "tt":
        return open_backend(BACKEND_TTNN, MeshDeviceConfig.from_tt_options(config.tt))
    if accelerator not in ("cpu", "cuda"):
        raise ConfigError(
            f"accelerator {accelerator!r}: the TT mesh engine runs on 'tt', or the torch program on 'cpu'/'cuda'"
        )
    return open_backend(BACKEND_TORCH)


# HF model types whose tt-metal generator resumes a prefill at a chunk start (vllm-tt-plugin
# ``_CHUNKED_PREFILL_MODEL_TYPES``); other classes opt in with ``supports_chunked_prefill``.
CHUNKED_PREFILL_MODEL_TYPES = frozenset({"gemma4", "gemma4_unified"})


def chunked_prefill_enabled(capabilities: Mapping[str, Any], hf_config: Any) -> bool:
    """Chunked prefill only where the model can resume one: a misaligned resume reads the wrong
    prefix silently, so a class that does not declare it gets whole-prompt prefills."""
    if capabilities.get(SUPPORTS_CHUNKED_PREFILL, False):
        return True
    return getattr(hf_config, "model_type", None) in CHUNKED_PREFILL_MODEL_TYPES


def check_lanes(config: TTEngineConfig, model_cls: type) -> None:
    """``data_parallel_size > 1`` becomes in-process lanes only for classes built for it."""
    if config.num_lanes > 1 and not folds_dp_into_lanes(model_cls):
        raise ConfigError(
            f"data_parallel_size={config.num_lanes}: {model_cls.__name__} runs a single lane per "
            "process (tt-metal folds data parallelism into in-process lanes only for the Galaxy "
            "generators and GPT-OSS); use replicas: over submeshes instead (one replica per "
            "submesh, each with its own MESH_DEVICE), with data_parallel_size 1"
        )


def build_mesh_model(model_cls: type[MeshModel], hf_config: Any, backend: Any, config: TTEngineConfig) -> MeshModel:
    """``model_cls`` on ``backend``'s mesh (None: no backend, an injected model class), adapted
    for the engine by the backend (``MeshBackend.adapt``: ttnn models get their event adapter)."""
    optional = {
        "max_seq_len": config.max_model_len,
        "tt_data_parallel": config.num_lanes,
        "optimizations": config.tt.optimizations,
    }
    mesh_device = getattr(backend, "mesh_device", None)
    model = load_mesh_model(model_cls, hf_config, mesh_device, config.max_num_seqs_global, **optional)
    adapted: MeshModel = backend.adapt(model) if backend is not None else model
    return adapted


def num_blocks_per_lane(model_cls: type[MeshModel], config: TTEngineConfig, num_devices: int = 1) -> int:
    """KV blocks per lane (§3): the override, else the model's token pool plus one block of
    headroom per slot, else every slot at full length. ``num_devices`` is the mesh's physical
    device count, as the plugin passes it (the class divides by ``tt_data_parallel`` itself)."""
    if config.num_gpu_blocks_override is not None:
        return config.num_gpu_blocks_override
    bs = config.block_size
    get_max = getattr(model_cls, "get_max_tokens_all_users", None)
    tokens = None
    if get_max is not None:
        tokens = get_max(
            model_name=config.model,
            num_devices=num_devices,
            tt_data_parallel=config.num_lanes,
            max_model_len=config.max_model_len,
            max_num_seqs=config.max_num_seqs,
        )
    if not tokens:
        tokens = config.max_num_seqs * config.max_model_len
    return max(-(-(int(tokens) + bs * config.max_num_seqs) // bs), config.max_num_blocks_per_req)


def mesh_num_devices(backend: Any) -> int:
    """Physical devices of the opened mesh (1 off-hardware)."""
    grid = getattr(getattr(backend, "mesh", None), "grid", None)
    return grid[0] * grid[1] if grid else 1


def devices_per_lane(backend: Any, num_lanes: int) -> int:
    return max(1, mesh_num_devices(backend) // num_lanes)


def kv_block_shape(
    hf_config: Any, config: TTEngineConfig, num_blocks: int, devices_per_lane: int
) -> tuple[int, int, int, int]:
    """Per-lane, per-layer KV shape (§3): tensor parallelism inside a lane folds into the heads."""
    num_heads = int(hf_config.num_attention_heads)
    num_kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or num_heads)
    head_dim = int(getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads)
    num_kv_heads //= min(devices_per_lane, num_kv_heads)
    return (num_blocks, num_kv_heads, config.block_size, head_dim)


def kv_dtype(model: Any, hf_config: Any, kv_cache_dtype: str = "auto") -> Any:
    """The **torch** dtype handed to ``allocate_kv_cache`` (what vllm-tt-plugin passes: vLLM's KV
    spec dtype; tt-metal allocates ``torch.zeros(shape, dtype=dtype)`` and picks its ttnn dtype,
    bfloat8_b by default, itself). "auto" = the model's dtype: the model instance's ``dtype``
    when it is a torch dtype (the torch program: fp32, token-exact vs HF), else the checkpoint's
    ``torch_dtype``, else bfloat16."""
    import torch

    if kv_cache_dtype != "auto":
        return {"bfloat16": torch.bfloat16, "float32": torch.float32}[kv_cache_dtype]
    own = getattr(model, "dtype", None)
    if isinstance(own, torch.dtype):
        return own
    declared = getattr(hf_config, "torch_dtype", None)
    if isinstance(declared, str):
        declared = getattr(torch, declared, None)
    return declared if isinstance(declared, torch.dtype) else torch.bfloat16


def allocate_kv_cache(model: Any, shape: tuple[int, int, int, int], dtype: Any, num_layers: int) -> Any:
    """``allocate_kv_cache_per_layer([(shape, dtype, layer), ...])`` when the class offers it (the
    plugin's preference; hybrid models need it), else the legacy ``allocate_kv_cache(shape,
    dtype, num_layers)``. Every layer gets its own buffer (``tensor_idx == layer``)."""
    per_layer = getattr(model, "allocate_kv_cache_per_layer", None)
    if per_layer is not None:
        return per_layer([(shape, dtype, i) for i in range(num_layers)])
    return model.allocate_kv_cache(shape, dtype, num_layers)


def platform_name(backend: Any, model: Any) -> str:
    if getattr(backend, "kind", None) == "ttnn":
        return "ttnn"
    device = getattr(model, "device", None)
    return f"tt-torch-{getattr(device, 'type', 'cpu')}"
