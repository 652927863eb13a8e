"""What one TT mesh engine is built from (``build_engine_parts``): the tokenizer, the model on its
mesh, one KV set per lane and the ``EngineCore`` over the lanes' schedulers. Built in the process
that runs the step loop: the front's own process (``StepThreadHost``) or the engine process
(``engine_process.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from accel.block_hash import BlockHash
from accel.contract import ConfigError
from accel.text.tokenizer import TextTokenizer, load_tokenizer
from accel.tt.async_decode import AsyncDecodeQueue
from accel.tt.block_allocator import BlockAllocator
from accel.tt.config import TTEngineConfig, check_model_capabilities
from accel.tt.engine_core import EngineCore, KVHookPoints
from accel.tt.grammars import EngineGrammars
from accel.tt.health import DEFAULT_STEP_TIMEOUT_S, DeviceProbe, device_probe
from accel.tt.lane_coordinator import LaneCoordinator
from accel.tt.mesh_model import SUPPORTS_ASYNC_DECODE, SUPPORTS_PREFIX_CACHING, MeshModel
from accel.tt.model_setup import (
    allocate_kv_cache,
    build_mesh_model,
    check_lanes,
    chunked_prefill_enabled,
    devices_per_lane,
    kv_block_shape,
    kv_dtype,
    load_hf_config,
    mesh_num_devices,
    num_blocks_per_lane,
    open_default_backend,
    platform_name,
    text_config,
)
from accel.tt.multimodal import VisionTraits, check_supported, vision_traits
from accel.tt.runner import MeshRunner
from accel.tt.sampling_policy import SamplingPolicy, device_logprobs_limit
from accel.tt.scheduler import LaneScheduler


@dataclass
class EngineParts:
    """What one mesh engine is built from, wherever its step loop runs (``build_engine_parts``)."""

    tokenizer: TextTokenizer
    hf_config: Any
    backend: Any
    model: MeshModel
    core: EngineCore
    grammars: EngineGrammars
    platform: str
    vocab_size: int
    vision: VisionTraits  # the class's image support and gates
    num_blocks_per_lane: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    device_probe: DeviceProbe | None

    def close(self) -> None:
        """Release the model and the device (after the step loop stopped)."""
        close = getattr(self.model, "close", None)
        if close is not None:
            close()
        if self.backend is not None and hasattr(self.backend, "close"):
            self.backend.close()


def build_engine_parts(
    config: TTEngineConfig,
    *,
    backend: Any = None,
    model_class: type[MeshModel] | None = None,
    keep_step_log: bool = False,
    kv_hooks: KVHookPoints | None = None,
    step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
    accelerator: str = "cpu",
) -> EngineParts:
    """Resolve the model class for the checkpoint's architecture, build it with
    ``initialize_vllm_model`` (global slot count, lane count), allocate one KV set per lane, warm
    up, and assemble the lanes' schedulers into the ``EngineCore``."""
    tokenizer = load_tokenizer(config.tokenizer_path)
    hf_config = load_hf_config(config.model)
    backend = backend if backend is not None or model_class is not None else open_default_backend(config, accelerator)
    model_cls = model_class or backend.model_class(hf_config)
    capabilities: Mapping[str, Any] = getattr(model_cls, "model_capabilities", {})
    check_model_capabilities(config, capabilities)
    check_lanes(config, model_cls)
    enable_chunked_prefill = chunked_prefill_enabled(capabilities, hf_config)
    prefill_budget = config.max_num_batched_tokens
    if not enable_chunked_prefill:  # the plugin's bump: a whole prompt fits one step
        prefill_budget = max(prefill_budget, config.max_model_len)
    enable_prefix_caching = (
        bool(capabilities.get(SUPPORTS_PREFIX_CACHING, False))
        if config.enable_prefix_caching is None
        else config.enable_prefix_caching
    )
    check_supported(model_cls)
    vision = vision_traits(model_cls)
    if enable_prefix_caching and vision.is_multimodal:
        # Block hashes are of token ids only: two prompts with different images would share the
        # blocks of their placeholder tokens (upstream vision classes do not declare it either).
        raise ConfigError(f"enable_prefix_caching: not supported for the multimodal class {model_cls.__name__}")
    model = build_mesh_model(model_cls, hf_config, backend, config)
    text = text_config(hf_config)
    vocab_size = int(text.vocab_size)
    blocks_per_lane = num_blocks_per_lane(model_cls, config, mesh_num_devices(backend))
    kv_shape = kv_block_shape(text, config, blocks_per_lane, devices_per_lane(backend, config.num_lanes))
    kv_cache = allocate_kv_cache(
        model, kv_shape, kv_dtype(model, hf_config, config.kv_cache_dtype), int(text.num_hidden_layers)
    )
    policy = SamplingPolicy(
        config.tt.sample_on_device_mode,
        config.tt.always_compat_sampling,
        dict(capabilities),
        device_logprobs_limit(mesh_num_devices(backend), str(getattr(hf_config, "model_type", ""))),
    )
    runner = MeshRunner(model, kv_cache, config, policy, tokenizer.eos_token_ids, vocab_size, vision)
    if config.tt.enable_model_warmup:
        runner.warmup()
    is_async = (
        config.async_scheduling
        and config.tt.trace_mode != "none"
        and bool(capabilities.get(SUPPORTS_ASYNC_DECODE, False))
    )
    lanes = [
        LaneScheduler(
            i,
            config.max_num_seqs,
            BlockAllocator(blocks_per_lane, config.block_size, enable_prefix_caching, lane=i),
            prefill_budget,
            config.max_model_len,
            enable_chunked_prefill=enable_chunked_prefill,
            mixes_image_rows=vision.mixes_text_and_image_rows,
        )
        for i in range(config.num_lanes)
    ]
    core = EngineCore(
        LaneCoordinator(lanes),
        AsyncDecodeQueue(runner, is_async),
        tokenizer.eos_token_ids,
        config.max_model_len,
        keep_step_log,
        kv_hooks=kv_hooks,
        kv_cache=kv_cache,
    )
    probe = device_probe(model, backend)
    return EngineParts(
        tokenizer=tokenizer,
        hf_config=hf_config,
        backend=backend,
        model=model,
        core=core,
        grammars=EngineGrammars(tokenizer, vocab_size),
        platform=platform_name(backend, model),
        vocab_size=vocab_size,
        vision=vision,
        num_blocks_per_lane=blocks_per_lane,
        enable_chunked_prefill=enable_chunked_prefill,
        enable_prefix_caching=enable_prefix_caching,
        device_probe=None if probe is None else DeviceProbe(probe, step_timeout_s),
    )


def lane_block_snapshot(core: EngineCore) -> list[BlockHash]:
    """Every block hash some lane holds in its prefix cache now (the union of the lane caches),
    least recently used first per lane. Safe from any thread (``BlockAllocator.cached_block_hashes``)."""
    seen: dict[BlockHash, None] = {}
    for lane in core.coordinator.lanes:
        for h in lane.allocator.cached_block_hashes():
            seen[h] = None
    return list(seen)
