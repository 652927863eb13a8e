"""``TTMeshEngine``: one Tenstorrent mesh (or its torch stand-in) driven from one process.

Construction resolves the model class for the checkpoint's architecture, builds it with
``initialize_vllm_model`` (global slot count, lane count), allocates one KV set per lane, warms
up, then starts ONE background thread running the step loop (no process per lane). The asyncio
side only validates requests, posts commands to that thread and reads per-request delta queues;
the thread owns every piece of scheduling state.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from accel.block_hash import BlockHash
from accel.contract import (
    EmbeddingResult,
    EmbedRequest,
    EngineStats,
    GenerateRequest,
    OutputDelta,
    PrefixCacheChange,
    TTEngineStats,
)
from accel.text.tokenizer import TextTokenizer, load_tokenizer
from accel.tt.async_decode import AsyncDecodeQueue
from accel.tt.block_allocator import BlockAllocator
from accel.tt.config import TTEngineConfig, check_model_capabilities
from accel.tt.core_messages import AbortRequest, InboxMessage
from accel.tt.engine_core import EngineCore, KVHookPoints, StepRecord
from accel.tt.grammars import EngineGrammars
from accel.tt.health import DEFAULT_STEP_TIMEOUT_S, DeviceProbe, EngineUnhealthy, device_probe
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
)
from accel.tt.pooling import refuse_pooling
from accel.tt.request_checks import check_request
from accel.tt.request_streams import RequestStreams
from accel.tt.runner import MeshRunner
from accel.tt.sampling_policy import SamplingPolicy, device_logprobs_limit
from accel.tt.scheduler import LaneScheduler
from accel.tt.step_loop import StepLoop

logger = logging.getLogger(__name__)


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
    model = build_mesh_model(model_cls, hf_config, backend, config)
    vocab_size = int(hf_config.vocab_size)
    blocks_per_lane = num_blocks_per_lane(model_cls, config, mesh_num_devices(backend))
    kv_shape = kv_block_shape(hf_config, config, blocks_per_lane, devices_per_lane(backend, config.num_lanes))
    kv_cache = allocate_kv_cache(
        model, kv_shape, kv_dtype(model, hf_config, config.kv_cache_dtype), int(hf_config.num_hidden_layers)
    )
    policy = SamplingPolicy(
        config.tt.sample_on_device_mode,
        config.tt.always_compat_sampling,
        dict(capabilities),
        device_logprobs_limit(mesh_num_devices(backend), str(getattr(hf_config, "model_type", ""))),
    )
    runner = MeshRunner(model, kv_cache, config, policy, tokenizer.eos_token_ids, vocab_size)
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


class TTMeshEngine:
    """Implements ``accel.contract.Engine`` for a TT mesh replica.

    ``backend``: an opened ``accel.tt.backend.MeshBackend`` (default: by ``accelerator``: "tt"
    the ttnn mesh or a startup error naming what is missing, "cpu"/"cuda" the torch program).
    ``model_class`` overrides the registry (tests, benchmarks). ``keep_step_log`` records a ``StepRecord`` per step.
    ``kv_hooks`` attaches prefill/decode KV transfer (``engine_core.KVHookPoints``); without it,
    requests asking for KV export/import are refused. ``step_timeout_s`` bounds a step and a
    device probe for ``check_health``.
    """

    def __init__(
        self,
        config: TTEngineConfig,
        *,
        backend: Any = None,
        model_class: type[MeshModel] | None = None,
        keep_step_log: bool = False,
        kv_hooks: KVHookPoints | None = None,
        step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
        accelerator: str = "cpu",
    ):
        self.config = config
        self.step_timeout_s = step_timeout_s
        parts = build_engine_parts(
            config,
            backend=backend,
            model_class=model_class,
            keep_step_log=keep_step_log,
            kv_hooks=kv_hooks,
            step_timeout_s=step_timeout_s,
            accelerator=accelerator,
        )
        self._parts = parts
        self.tokenizer = parts.tokenizer
        self.model = parts.model
        self.core = parts.core
        self.platform = parts.platform
        self.vocab_size = parts.vocab_size
        self.num_blocks_per_lane = parts.num_blocks_per_lane
        self.enable_chunked_prefill = parts.enable_chunked_prefill
        self.enable_prefix_caching = parts.enable_prefix_caching
        self._grammars = parts.grammars
        self._streams = RequestStreams(self.tokenizer, config.max_model_len, self._post)
        self._loop = StepLoop(self.core, self._grammars, self.platform, self._streams.deliver)
        self._stop_lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop.run, name="tt-mesh-engine", daemon=True)
        self._thread.start()

    # ---- public API (Engine contract) ----------------------------------------------------
    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    @property
    def num_busy_iterations(self) -> int:
        return self._loop.num_busy_iterations

    @property
    def host_busy_s(self) -> float:
        return self._loop.host_busy_s

    async def generate(self, request: GenerateRequest) -> AsyncIterator[OutputDelta]:
        """Stream ``request``'s deltas (``RequestStreams.stream``); the last one has
        ``finish_reason`` set. Leaving the iteration early (client gone) aborts the request and
        frees its blocks. Structured-output grammars compile and KV imports prefetch here, off
        the step loop."""
        check_request(
            request,
            vocab_size=self.vocab_size,
            max_model_len=self.max_model_len,
            can_transfer_kv=self.core.kv_hooks is not None,
        )
        grammar = None
        if request.sampling.structured_outputs is not None:  # compiled off the step loop (and cached)
            grammar = await self._grammars.compile(request.sampling.structured_outputs)
        if request.kv_transfer is not None and self.core.kv_hooks is not None:
            await self.core.kv_hooks.prefetch(request)  # a KV import's RPCs, off the engine thread
        async for delta in self._streams.stream(request, grammar):
            yield delta

    async def abort(self, request_id: str) -> None:
        self._post(AbortRequest(request_id))

    async def embed(self, request: EmbedRequest) -> EmbeddingResult:
        refuse_pooling(request)  # generative models only

    def stats(self) -> EngineStats:
        return self._loop.stats

    def extra_stats(self) -> TTEngineStats:
        """How the steps ran (step modes, where sampling ran, lane occupancy, async overlap), as
        of the latest step-loop iteration."""
        return self._loop.extra_stats

    def take_kv_events(self) -> list[PrefixCacheChange]:
        """KV blocks stored / evicted since the previous call, per lane (for the router's prefix
        index)."""
        return self._loop.take_kv_events()

    def kv_block_snapshot(self) -> list[BlockHash]:
        """Every block hash some lane holds in its prefix cache now (the union of the lane caches
        whose changes ``take_kv_events`` reports), least recently used first per lane. For a
        router that (re)starts: it rebuilds its precise index from this (lanes unknown: a block
        counts for every lane until a lane's removal), then follows the events."""
        return lane_block_snapshot(self.core)

    @property
    def step_log(self) -> list[StepRecord]:
        return self.core.step_log

    async def check_health(self) -> None:
        """Raise ``EngineUnhealthy`` when the step loop is gone (shut down, thread died), hung
        (requests in flight and no loop iteration within ``step_timeout_s``), or the device queue
        does not answer a probe within ``step_timeout_s`` (``accel.tt.health``). Never blocks."""
        if self._loop.is_stopped or not self._thread.is_alive():
            raise EngineUnhealthy("the TT mesh engine's step loop is not running")
        problem = self._loop.health_problem(self.step_timeout_s, self._parts.device_probe)
        if problem is not None:
            raise EngineUnhealthy(problem)

    async def shutdown(self) -> None:
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        with self._stop_lock:
            if self._loop.is_stopped:
                return
            self._streams.close("the TT mesh engine is shut down")
            self._loop.stop()
        self._thread.join(timeout=self.step_timeout_s)
        if self._thread.is_alive():  # hung in a forward: leave the model to the process's exit
            logger.error("TT mesh engine: the step loop did not stop within %.0f s", self.step_timeout_s)
            return
        self._parts.close()

    def _post(self, message: InboxMessage) -> None:
        self._loop.post(message)
