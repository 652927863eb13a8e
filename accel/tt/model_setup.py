"""Building a mesh model for the TT engine: HF config, backend, model instance, KV sizing.

Everything here runs once, at engine construction; the step loop never calls it. Section
numbers (§3) refer to the project's tt-mesh-engine reference notes.
"""

from __future__ import annotations

from typing import Any

from accel.tt.backend import load_mesh_model, open_backend
from accel.tt.config import TTEngineConfig
from accel.tt.mesh_device import MeshDeviceConfig
from accel.tt.mesh_model import MeshModel


def load_hf_config(model: str) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model, local_files_only=True)


def open_default_backend(config: TTEngineConfig) -> Any:
    """The ttnn mesh (opened with ``additional_config.tt``'s device options) when chips are
    present, else the torch program."""
    return open_backend("auto", MeshDeviceConfig.from_tt_options(config.tt))


def build_mesh_model(model_cls: type[MeshModel], hf_config: Any, backend: Any, config: TTEngineConfig) -> Any:
    """``model_cls`` on ``backend``'s mesh (None: no backend, an injected model class), adapted
    for the engine by the backend (``MeshBackend.adapt``: ttnn models get their event adapter)."""
    optional = {
        "max_seq_len": config.max_model_len,
        "tt_data_parallel": config.num_lanes,
        "optimizations": config.tt.optimizations,
    }
    mesh_device = getattr(backend, "mesh_device", None)
    model = load_mesh_model(model_cls, hf_config, mesh_device, config.max_num_seqs_global, **optional)
    return backend.adapt(model) if backend is not None else model


def num_blocks_per_lane(model_cls: type[MeshModel], config: TTEngineConfig) -> int:
    """KV blocks per lane (§3): the override, else the model's token pool plus one block of
    headroom per slot, else every slot at full length."""
    if config.num_gpu_blocks_override is not None:
        return config.num_gpu_blocks_override
    bs = config.block_size
    get_max = getattr(model_cls, "get_max_tokens_all_users", None)
    tokens = None
    if get_max is not None:
        tokens = get_max(
            model_name=config.model,
            num_devices=1,
            tt_data_parallel=config.num_lanes,
            max_model_len=config.max_model_len,
            max_num_seqs=config.max_num_seqs,
        )
    if not tokens:
        tokens = config.max_num_seqs * config.max_model_len
    return max(-(-(int(tokens) + bs * config.max_num_seqs) // bs), config.max_num_blocks_per_req)


def devices_per_lane(backend: Any, num_lanes: int) -> int:
    grid = getattr(getattr(backend, "mesh", None), "grid", None)
    return max(1, (grid[0] * grid[1]) // num_lanes) if grid else 1


def kv_block_shape(
    hf_config: Any, config: TTEngineConfig, num_blocks: int, devices_per_lane: int
) -> tuple[int, int, int, int]:
    """Per-lane, per-layer KV shape (§3): tensor parallelism inside a lane folds into the heads."""
    num_heads = int(hf_config.num_attention_heads)
    num_kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or num_heads)
    head_dim = int(getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads)
    num_kv_heads //= min(devices_per_lane, num_kv_heads)
    return (num_blocks, num_kv_heads, config.block_size, head_dim)


def kv_dtype(backend: Any, kv_cache_dtype: str = "auto") -> Any:
    """The dtype handed to ``allocate_kv_cache``. On a mesh (ttnn backend): ``ttnn.bfloat8_b`` for
    "auto" — what tt-metal's generators allocate by default — else the ttnn type of that name.
    Elsewhere a torch dtype; "auto" = None, which the torch program reads as "the model's dtype"
    (fp32 for the tiny checkpoints: token-exact vs HF)."""
    if getattr(backend, "kind", None) == "ttnn":
        ttnn = backend.ttnn
        return {"auto": ttnn.bfloat8_b, "bfloat16": ttnn.bfloat16, "float32": ttnn.float32}[kv_cache_dtype]
    import torch

    return {"auto": None, "bfloat16": torch.bfloat16, "float32": torch.float32}[kv_cache_dtype]


def platform_name(backend: Any, model: Any) -> str:
    if getattr(backend, "kind", None) == "ttnn":
        return "ttnn"
    device = getattr(model, "device", None)
    return f"tt-torch-{getattr(device, 'type', 'cpu')}"
