"""``TTMeshEngine``: the one front of a Tenstorrent mesh engine (or its torch stand-in).

The front implements ``accel.contract.Engine``: it validates requests, keeps the per-request
streams (``RequestStreams``: detokenizing, stop strings) and posts typed inbox messages to the
step loop. Where that loop runs is its ``StepLoopHost``, a composed strategy:
``StepThreadHost`` (default: the model built in this process, ONE background thread running the
step loop, no process per lane) or ``EngineProcessHost`` (``TTMeshEngine.in_engine_process``: the
model and step loop in a spawned engine process, its own GIL).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
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
from accel.tt.config import TTEngineConfig
from accel.tt.core_messages import AbortRequest
from accel.tt.engine_core import EngineCore, KVHookPoints, StepRecord
from accel.tt.engine_parts import EngineParts, build_engine_parts
from accel.tt.engine_process_host import EngineProcessHost
from accel.tt.health import DEFAULT_STEP_TIMEOUT_S, EngineUnhealthy
from accel.tt.mesh_model import MeshModel
from accel.tt.multimodal import ImageInput
from accel.tt.pooling import refuse_pooling
from accel.tt.request_checks import check_images, check_request
from accel.tt.request_images import RequestImages
from accel.tt.request_streams import RequestStreams
from accel.tt.step_loop_host import StepLoopHost
from accel.tt.step_thread_host import StepThreadHost

SHUT_DOWN = "the TT mesh engine is shut down"


class TTMeshEngine:
    """Implements ``accel.contract.Engine`` for a TT mesh replica.

    ``host``: where the step loop runs, already started up (then the build arguments below are
    unused); by default a ``StepThreadHost`` over ``build_engine_parts`` of them:
    ``backend``, an opened ``accel.tt.backend.MeshBackend`` (default: by ``accelerator``: "tt"
    the ttnn mesh or a startup error naming what is missing, "cpu"/"cuda" the torch program);
    ``model_class`` overrides the registry (tests, benchmarks); ``keep_step_log`` records a
    ``StepRecord`` per step; ``kv_hooks`` attaches prefill/decode KV transfer
    (``engine_core.KVHookPoints``; without it, requests asking for KV export/import are refused).
    ``step_timeout_s`` bounds a step and a device probe for ``check_health``.
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
        host: StepLoopHost | None = None,
    ):
        self.config = config
        self.step_timeout_s = step_timeout_s
        if host is None:
            parts = build_engine_parts(
                config,
                backend=backend,
                model_class=model_class,
                keep_step_log=keep_step_log,
                kv_hooks=kv_hooks,
                step_timeout_s=step_timeout_s,
                accelerator=accelerator,
            )
            host = StepThreadHost(parts, step_timeout_s)
        self.host = host
        self.tokenizer = host.tokenizer
        self.vocab_size = host.vocab_size
        self.platform = host.platform
        self.num_blocks_per_lane = host.num_blocks_per_lane
        self._streams = RequestStreams(self.tokenizer, config.max_model_len, host.post)
        self._request_images = RequestImages(config.model, host.vision)
        self._close_lock = threading.Lock()
        self._is_closed = False
        host.start(self._streams)

    @classmethod
    def in_engine_process(
        cls,
        config: TTEngineConfig,
        *,
        model_class: type[MeshModel] | None = None,
        step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
        accelerator: str = "cpu",
    ) -> TTMeshEngine:
        """The engine with its model and step loop in an engine process of its own (started and
        waited for here: a build error is raised here). No PD KV hooks (they call Ray)."""
        host = EngineProcessHost(
            config, model_class=model_class, step_timeout_s=step_timeout_s, accelerator=accelerator
        )
        return cls(config, step_timeout_s=step_timeout_s, host=host)

    # ---- public API (Engine contract) ----------------------------------------------------
    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    @property
    def num_busy_iterations(self) -> int:
        return self.host.num_busy_iterations

    @property
    def host_busy_s(self) -> float:
        return self.host.host_busy_s

    @property
    def engine_process_pid(self) -> int | None:
        """The engine process's pid (for CPU accounting); None when the loop runs here."""
        return self.host.pid

    @property
    def torch_threads(self) -> int:
        """Torch intra-op threads where the model runs (``set_torch_threads_for_serving``)."""
        return self.host.torch_threads

    async def generate(
        self, request: GenerateRequest, images: tuple[ImageInput, ...] = ()
    ) -> AsyncIterator[OutputDelta]:
        """Stream ``request``'s deltas (``RequestStreams.stream``); the last one has
        ``finish_reason`` set. Leaving the iteration early (client gone) aborts the request and
        frees its blocks. Structured-output grammars compile and KV imports prefetch off the step
        loop (``StepLoopHost.admit``). ``request.images`` (encoded files) go through the
        checkpoint's HF image processor here (``RequestImages``); ``images``: images already
        processed, their placeholder tokens expanded in the prompt (tests, benchmarks)."""
        if request.images:
            if images:
                raise ValueError("a request carries encoded images or processed ones, not both")
            request, images = await self._request_images.prepare(request)
        check_request(
            request,
            vocab_size=self.vocab_size,
            max_model_len=self.max_model_len,
            can_transfer_kv=self.host.can_transfer_kv,
        )
        check_images(request, images, self.host.vision, self.config.model)
        grammar = await self.host.admit(request)
        async for delta in self._streams.stream(request, grammar, images):
            yield delta

    async def abort(self, request_id: str) -> None:
        self.host.post(AbortRequest(request_id))

    async def embed(self, request: EmbedRequest) -> EmbeddingResult:
        refuse_pooling(request)  # generative models only

    def stats(self) -> EngineStats:
        return self.host.stats()

    def extra_stats(self) -> TTEngineStats:
        """How the steps ran (step modes, where sampling ran, lane occupancy, async overlap), as
        of the latest step-loop iteration."""
        return self.host.extra_stats()

    def take_kv_events(self) -> list[PrefixCacheChange]:
        """KV blocks stored / evicted since the previous call, per lane (for the router's prefix
        index)."""
        return self.host.take_kv_events()

    def kv_block_snapshot(self) -> list[BlockHash]:
        """Every block hash some lane holds in its prefix cache now (the union of the lane caches
        whose changes ``take_kv_events`` reports), least recently used first per lane. For a
        router that (re)starts: it rebuilds its precise index from this (lanes unknown: a block
        counts for every lane until a lane's removal), then follows the events. Blocks at most
        ``step_timeout_s`` when the loop runs in an engine process."""
        return self.host.kv_block_snapshot()

    async def check_health(self) -> None:
        """Raise ``EngineUnhealthy`` when the step loop is gone (shut down, thread or engine
        process died), hung (requests in flight and no loop iteration within ``step_timeout_s``),
        or the device queue does not answer a probe within ``step_timeout_s``
        (``accel.tt.health``)."""
        problem = await self.host.health_problem()
        if problem is not None:
            raise EngineUnhealthy(problem)

    async def shutdown(self) -> None:
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Refuse new requests, then stop the step loop (what it still holds is aborted) and
        release the model and device. Idempotent."""
        with self._close_lock:
            if self._is_closed:
                return
            self._is_closed = True
            self._streams.close(SHUT_DOWN)
        self.host.stop()

    # ---- the model and EngineCore, when they live in this process (tests, benchmarks) ------
    @property
    def parts(self) -> EngineParts:
        if not isinstance(self.host, StepThreadHost):
            raise AttributeError("the TT engine's model and EngineCore live in its engine process")
        return self.host.parts

    @property
    def core(self) -> EngineCore:
        return self.parts.core

    @property
    def model(self) -> MeshModel:
        return self.parts.model

    @property
    def step_log(self) -> list[StepRecord]:
        return self.parts.core.step_log

    @property
    def enable_chunked_prefill(self) -> bool:
        return self.parts.enable_chunked_prefill

    @property
    def enable_prefix_caching(self) -> bool:
        return self.parts.enable_prefix_caching
