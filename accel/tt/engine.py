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
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from accel.block_hash import BlockHash
from accel.contract import (
    EngineStats,
    FinishReason,
    GenerateRequest,
    InvalidRequestError,
    OutputDelta,
    PrefixCacheChange,
    TTEngineStats,
)
from accel.text.output_builder import OutputBuilder
from accel.text.tokenizer import load_tokenizer
from accel.tt.async_decode import AsyncDecodeQueue
from accel.tt.block_pool import BlockPool
from accel.tt.config import TTEngineConfig, check_model_capabilities
from accel.tt.core_messages import (
    AbortRequest,
    AddRequest,
    FinishRequest,
    InboxMessage,
    OutboxMessage,
    RequestFailed,
    put_all,
    take_pending,
)
from accel.tt.engine_core import EngineCore, KVHookPoints, StepRecord
from accel.tt.grammars import EngineGrammars
from accel.tt.health import DEFAULT_STEP_TIMEOUT_S, DeviceProbe, EngineUnhealthy, device_probe, stalled_problem
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
from accel.tt.request_checks import check_request
from accel.tt.request_state import RequestState
from accel.tt.runner import MeshRunner
from accel.tt.sampling_policy import SamplingPolicy
from accel.tt.scheduler import LaneScheduler

logger = logging.getLogger(__name__)


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
        self.tokenizer = load_tokenizer(config.tokenizer_path)
        self._hf_config = load_hf_config(config.model)
        self._backend = (
            backend if backend is not None or model_class is not None else open_default_backend(config, accelerator)
        )
        model_cls = model_class or self._backend.model_class(self._hf_config)
        capabilities: Mapping[str, Any] = getattr(model_cls, "model_capabilities", {})
        check_model_capabilities(config, capabilities)
        check_lanes(config, model_cls)
        self.enable_chunked_prefill = chunked_prefill_enabled(capabilities, self._hf_config)
        prefill_budget = config.max_num_batched_tokens
        if not self.enable_chunked_prefill:  # the plugin's bump: a whole prompt fits one step
            prefill_budget = max(prefill_budget, config.max_model_len)
        self.enable_prefix_caching = (
            bool(capabilities.get(SUPPORTS_PREFIX_CACHING, False))
            if config.enable_prefix_caching is None
            else config.enable_prefix_caching
        )
        self.model = build_mesh_model(model_cls, self._hf_config, self._backend, config)
        self.vocab_size = int(self._hf_config.vocab_size)
        self.num_blocks_per_lane = num_blocks_per_lane(model_cls, config, mesh_num_devices(self._backend))
        kv_shape = kv_block_shape(
            self._hf_config, config, self.num_blocks_per_lane, devices_per_lane(self._backend, config.num_lanes)
        )
        kv_cache = allocate_kv_cache(
            self.model,
            kv_shape,
            kv_dtype(self.model, self._hf_config, config.kv_cache_dtype),
            int(self._hf_config.num_hidden_layers),
        )
        policy = SamplingPolicy(config.tt.sample_on_device_mode, config.tt.always_compat_sampling, dict(capabilities))
        runner = MeshRunner(self.model, kv_cache, config, policy, self.tokenizer.eos_token_ids, self.vocab_size)
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
                BlockPool(self.num_blocks_per_lane, config.block_size, self.enable_prefix_caching, lane=i),
                prefill_budget,
                config.max_model_len,
                enable_chunked_prefill=self.enable_chunked_prefill,
            )
            for i in range(config.num_lanes)
        ]
        self.core = EngineCore(
            LaneCoordinator(lanes),
            AsyncDecodeQueue(runner, is_async),
            self.tokenizer.eos_token_ids,
            config.max_model_len,
            keep_step_log,
            kv_hooks=kv_hooks,
            kv_cache=kv_cache,
        )
        self.platform = platform_name(self._backend, self.model)
        self._grammars = EngineGrammars(self.tokenizer, self.vocab_size)
        self._cv = threading.Condition()
        self._inbox: deque[InboxMessage] = deque()
        self._sinks: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[OutboxMessage]]] = {}
        self._kv_events: deque[PrefixCacheChange] = deque()
        self._stats = self.core.stats(self.platform)
        self._extra_stats = self.core.step_stats()
        self._stopped = False
        # Step-loop host cost: CPU time of this engine's thread in iterations that ran a step
        # (blocking on the mesh, waiting for the GIL or for a core costs none).
        self.num_busy_iterations = 0
        self.host_busy_s = 0.0
        self._last_iteration_at = time.monotonic()  # heartbeat of the step loop
        probe = device_probe(self.model, self._backend)
        self._device_probe = None if probe is None else DeviceProbe(probe, step_timeout_s)
        self._thread = threading.Thread(target=self._loop, name="tt-mesh-engine", daemon=True)
        self._thread.start()

    # ---- public API (Engine contract) ----------------------------------------------------
    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    async def generate(self, request: GenerateRequest) -> AsyncIterator[OutputDelta]:
        """Stream ``request``'s deltas; the last one has ``finish_reason`` set. Leaving the
        iteration early (client gone) aborts the request and frees its blocks.

        The engine thread sends sampled token ids; this coroutine turns them into deltas with the
        shared ``OutputBuilder`` (detokenization, stop strings, eos, max_tokens, max_model_len),
        so that work stays off the step loop. A stop the builder sees is posted back
        (``FinishRequest``).
        """
        check_request(
            request,
            vocab_size=self.vocab_size,
            max_model_len=self.max_model_len,
            can_transfer_kv=self.core.kv_hooks is not None,
        )
        req_id = request.request_id
        grammar = None
        if request.sampling.structured_outputs is not None:  # compiled off the step loop (and cached)
            grammar = await self._grammars.compile(request.sampling.structured_outputs)
        if request.kv_transfer is not None and self.core.kv_hooks is not None:
            await self.core.kv_hooks.prefetch(request)  # a KV import's RPCs, off the engine thread
        queue: asyncio.Queue[OutboxMessage] = asyncio.Queue()
        with self._cv:
            if self._stopped:
                raise RuntimeError("the TT mesh engine is shut down")
            if req_id in self._sinks:
                raise InvalidRequestError("request_id", f"{req_id!r} is already running")
            self._sinks[req_id] = (asyncio.get_running_loop(), queue)
        builder = OutputBuilder(request, self.tokenizer.fast, self.tokenizer.eos_token_ids, self.max_model_len)
        self._post(AddRequest(request, grammar))
        try:
            while not builder.finished:
                news = take_pending(await queue.get(), queue)  # raises the error of a RequestFailed
                builder.num_cached_tokens = news.num_cached_tokens
                if news.token_ids:
                    delta = builder.add_tokens(news.token_ids, news.logprobs, kv_transfer=news.kv_transfer)
                    if delta.finished:
                        self._post(FinishRequest(req_id))  # a no-op when the engine already stopped it
                    yield delta
                if news.is_aborted and not builder.finished:
                    yield builder.finish(FinishReason.ABORT)
        finally:
            if not builder.finished:
                self._post(AbortRequest(req_id))
            with self._cv:
                self._sinks.pop(req_id, None)

    async def abort(self, request_id: str) -> None:
        self._post(AbortRequest(request_id))

    def stats(self) -> EngineStats:
        return self._stats

    def extra_stats(self) -> TTEngineStats:
        """How the steps ran (step modes, where sampling ran, lane occupancy, async overlap), as
        of the latest step-loop iteration."""
        return self._extra_stats

    def take_kv_events(self) -> list[PrefixCacheChange]:
        """KV blocks stored / evicted since the previous call, per lane (for the router's prefix
        index)."""
        events = []
        while self._kv_events:
            events.append(self._kv_events.popleft())
        return events

    def kv_block_snapshot(self) -> list[BlockHash]:
        """Every block hash some lane holds in its prefix cache now (the union of the lane caches
        whose changes ``take_kv_events`` reports), least recently used first per lane. For a
        router that (re)starts: it rebuilds its precise index from this (lanes unknown: a block
        counts for every lane until a lane's removal), then follows the events."""
        seen: dict[BlockHash, None] = {}
        for lane in self.core.coordinator.lanes:
            for h in lane.pool.cached_block_hashes():
                seen[h] = None
        return list(seen)

    @property
    def step_log(self) -> list[StepRecord]:
        return self.core.step_log

    async def check_health(self) -> None:
        """Raise ``EngineUnhealthy`` when the step loop is gone (shut down, thread died), hung
        (requests in flight and no loop iteration within ``step_timeout_s``), or the device queue
        does not answer a probe within ``step_timeout_s`` (``accel.tt.health``). Never blocks."""
        if self._stopped or not self._thread.is_alive():
            raise EngineUnhealthy("the TT mesh engine's step loop is not running")
        num_inflight = len(self.core.requests) + len(self._inbox)  # read-only peeks from this thread
        problem = stalled_problem(
            last_iteration_at=self._last_iteration_at, num_inflight=num_inflight, step_timeout_s=self.step_timeout_s
        )
        if problem is None and self._device_probe is not None:
            problem = self._device_probe.problem()
        if problem is not None:
            raise EngineUnhealthy(problem)

    async def shutdown(self) -> None:
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        with self._cv:
            if self._stopped:
                return
            self._stopped = True
            self._cv.notify()
        self._thread.join(timeout=self.step_timeout_s)
        if self._thread.is_alive():  # hung in a forward: leave the model to the process's exit
            logger.error("TT mesh engine: the step loop did not stop within %.0f s", self.step_timeout_s)
            return
        close = getattr(self.model, "close", None)
        if close is not None:
            close()
        if self._backend is not None and hasattr(self._backend, "close"):
            self._backend.close()

    # ---- the step loop (engine thread) ---------------------------------------------------
    def _post(self, message: InboxMessage) -> None:
        with self._cv:
            self._inbox.append(message)
            self._cv.notify()

    def _loop(self) -> None:
        """Each iteration: apply the inbox, run one engine step (schedule -> execute -> update, in
        ``EngineCore.step``), publish stats and KV events, hand the outputs to their consumers."""
        while (messages := self._wait_for_work()) is not None:
            started_cpu_s = time.thread_time()
            outputs = [out for message in messages for out in self._apply_safely(message)]
            ran_step = self.core.has_work()
            if ran_step:
                num_steps = self.core.num_steps
                outputs += self._step_safely()
                if not outputs and self.core.num_steps == num_steps:
                    with self._cv:  # nothing could run (waiting on nothing): avoid spinning
                        self._cv.wait(0.001)
            self._kv_events.extend(self.core.take_kv_events())
            self._stats = self.core.stats(self.platform)  # before delivering: a finished stream sees its blocks freed
            self._extra_stats = self.core.step_stats()
            self._deliver(outputs)
            if ran_step:
                self.num_busy_iterations += 1
                self.host_busy_s += time.thread_time() - started_cpu_s
            self._last_iteration_at = time.monotonic()
        self._deliver(self.core.drain())
        for req_id in list(self.core.requests):
            notice = self.core.abort_request(req_id)
            self._deliver([] if notice is None else [notice])

    def _wait_for_work(self) -> list[InboxMessage] | None:
        """The posted messages, once there is anything to do (they, or work in the core); None
        once the engine is stopped."""
        with self._cv:
            while not self._inbox and not self._stopped and not self.core.has_work():
                self._cv.wait()
                self._last_iteration_at = time.monotonic()
            if self._stopped:
                return None
            messages = list(self._inbox)
            self._inbox.clear()
        return messages

    def _apply_safely(self, message: InboxMessage) -> list[OutboxMessage]:
        try:
            return self._apply(message)
        except Exception as exc:  # e.g. a KV import hook failing: fail that request only
            logger.exception("TT mesh engine: %s of %s failed", message.verb, message.req_id)
            error = RuntimeError(f"TT mesh engine could not {message.verb} {message.req_id}: {exc}")
            return [RequestFailed(message.req_id, error)]

    def _apply(self, message: InboxMessage) -> list[OutboxMessage]:
        if isinstance(message, AddRequest):
            r = RequestState.new(message.request)
            if message.request.sampling.has_logit_constraints:
                r.constraint = self._grammars.constraint(message.request, message.grammar)
            self.core.add_request(r)
        elif isinstance(message, FinishRequest):
            self.core.finish_request(message.req_id)
        else:
            notice = self.core.abort_request(message.req_id)
            return [] if notice is None else [notice]
        return []

    def _step_safely(self) -> list[OutboxMessage]:
        try:
            return list(self.core.step())
        except Exception as exc:  # a failed forward must not kill the replica
            logger.exception("TT mesh engine step failed; aborting every request")
            return self._fail_all(exc)

    def _fail_all(self, exc: Exception) -> list[OutboxMessage]:
        failed: list[OutboxMessage] = []
        for req_id in list(self.core.requests):
            self.core.abort_request(req_id)
            failed.append(RequestFailed(req_id, RuntimeError(f"TT mesh engine step failed: {exc}")))
        self.core.queue.reset()
        return failed

    def _deliver(self, messages: Sequence[OutboxMessage]) -> None:
        """Hand each message to its request's asyncio queue, one ``call_soon_threadsafe`` per
        event loop per step."""
        if not messages:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[OutboxMessage], OutboxMessage]]] = {}
        with self._cv:
            for message in messages:
                sink = self._sinks.get(message.req_id)
                if sink is not None:
                    by_loop.setdefault(sink[0], []).append((sink[1], message))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(put_all, batch)
            except RuntimeError:  # that event loop is closed; its requests are gone
                pass
