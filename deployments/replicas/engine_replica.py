"""What every engine replica does, whatever the engine: stream deltas, abort on cancel,
report stats for routing and metrics, health, graceful shutdown.

``TTMeshReplica`` and ``VllmReplica`` differ only in how their engine is built and placed
(``tt_replica.py`` / ``vllm_replica.py``). ``engine_factory`` is injectable so the replica is
testable with any ``accel.contract.Engine``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import pickle
import threading
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterable, Mapping
from typing import Any

from prometheus_client import REGISTRY

from accel.contract import (
    EmbeddingResult,
    EmbedRequest,
    Engine,
    EngineStats,
    FinishReason,
    GenerateRequest,
    OutputDelta,
    PrefixCacheChange,
)
from deployments.config.app import PoolConfig
from deployments.messages.kv_events import BlockRemoved, BlockStored, KVCursor, KVEvent, Tier
from deployments.messages.replica_snapshot import ReplicaSnapshot
from deployments.replicas.delta_coalescer import DeltaCoalescer
from deployments.replicas.kv_event_log import DEFAULT_CAPACITY_EVENTS, KVEventLog
from deployments.telemetry.metrics import EngineMetrics
from deployments.telemetry.snapshot import MetricsSnapshot, registry_snapshot, with_label

logger = logging.getLogger(__name__)

EngineFactory = Callable[[PoolConfig], Engine]
STATS_PERIOD_S = 1.0


def plainly_picklable(exc: Exception) -> Exception:
    """``exc`` if plain ``pickle`` round-trips it (the ingress reads the token stream with plain
    pickle: ``EngineClient``), else a ``RuntimeError`` carrying its type and message (e.g. Ray's
    dynamically made ``RayTaskError(ValueError)`` classes, which only cloudpickle can carry)."""
    try:
        pickle.loads(pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def current_replica_id() -> str:
    """Serve's unique replica id (what ``RunningReplica.replica_id.unique_id`` holds)."""
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # constructed outside Serve (unit tests)
        return f"local-{os.getpid()}-{id(object())}"


def current_actor_id() -> str | None:
    """This process's Ray actor id (hex), what ``RayActorError.actor_id`` names when it dies."""
    try:
        import ray

        if not ray.is_initialized():  # (get_runtime_context would start a local Ray)
            return None
        return ray.get_runtime_context().get_actor_id()
    except Exception:
        return None


def kv_events_for_router(engine_events: Iterable[PrefixCacheChange]) -> tuple[KVEvent, ...]:
    """An engine's ``PrefixCacheChange``s (the TT engine's per lane: each lane is its own prefix
    cache) as the router's event types, lane kept (the router's index matches per lane)."""
    out: list[KVEvent] = []
    for event in engine_events:
        if event.kind == "stored":
            out.append(BlockStored(tuple(event.block_hashes), event.lane))
        elif event.kind == "removed":
            out.append(BlockRemoved(tuple(event.block_hashes), event.lane))
    return tuple(out)


class EngineReplica:
    def __init__(
        self,
        pool: PoolConfig,
        engine_factory: EngineFactory,
        emit_vllm_metrics: bool = True,
        kv_event_log_size: int = DEFAULT_CAPACITY_EVENTS,
    ):
        """``emit_vllm_metrics`` False when the engine emits ``vllm_*`` itself (vLLM with Ray's
        stat logger): one process must not register the same metric twice.
        ``kv_event_log_size``: KV events kept for routers that poll (``kv_event_log``)."""
        self.pool = pool
        self.replica_id = current_replica_id()
        self.actor_id = current_actor_id()
        self._engine = engine_factory(pool)
        self._kv_log = KVEventLog(kv_event_log_size)
        # One poll at a time: drain -> log -> read (-> snapshot) must not interleave with another
        # router's poll (Serve runs this sync method on a thread pool).
        self._routing_lock = threading.Lock()
        self._num_inflight = 0
        # Health: the open streams (to fail them when the replica is found unhealthy) and when the
        # engine last produced output for any of them (or the first one came in).
        self._streams: dict[int, DeltaCoalescer] = {}
        self._last_progress_at = time.monotonic()
        self._stats_task: asyncio.Task[None] | None = None
        self._metrics = self._make_metrics(emit_vllm_metrics)
        self._reads_vllm_registry = not emit_vllm_metrics  # vLLM's own stat logger keeps vllm:*
        self._is_shut_down = False

    def _make_metrics(self, emit_vllm_metrics: bool) -> EngineMetrics | None:
        try:
            return EngineMetrics(
                self.pool.model, self.pool.name, self.replica_id, emit_vllm_metrics, self.pool.max_model_len
            )
        except Exception:
            logger.warning("metrics unavailable in this process", exc_info=True)
            return None

    # -- request path -------------------------------------------------------------------------

    async def generate(
        self, request: GenerateRequest, replica_hint: str | None = None
    ) -> AsyncGenerator[OutputDelta, None]:
        """Stream the request's deltas. ``replica_hint`` is read by the handle's request router
        (``PinnedReplicaRequestRouter``), not here. If the caller goes away (Serve cancels this
        generator) the engine request is aborted, which frees its KV blocks.

        Messages are coalesced (``DeltaCoalescer``): while this replica streams more than one
        request, each stream sends at most one message per ``pool.stream_interval_s`` (its first
        at once; a finished delta or an error at once); a lone stream sends every delta as it
        comes. Deltas that pile up behind a slow consumer are merged as well."""
        del replica_hint
        self._ensure_stats_task()
        if self._num_inflight == 0:
            self._last_progress_at = time.monotonic()  # idle time is not a stall
        self._num_inflight += 1
        start = time.monotonic()
        out = DeltaCoalescer(self.pool.stream_interval_s, self._is_streaming_several)
        self._streams[id(out)] = out
        pump = asyncio.get_running_loop().create_task(self._pump(request, out, start))
        finished: OutputDelta | None = None
        try:
            while finished is None:
                try:
                    delta = await out.next()
                except Exception as exc:
                    safe = plainly_picklable(exc)
                    if safe is exc:
                        raise
                    raise safe from exc
                if delta.finished:
                    finished = delta
                yield delta
        finally:
            self._num_inflight -= 1
            self._streams.pop(id(out), None)
            if self.pool.placement == "ingress":
                # No router polls an engine inside the ingress: its KV events would pile up
                # in the engine's buffer for ever (the engine has nothing else to route by).
                self._engine.take_kv_events()
            if finished is None:
                pump.cancel()
                await self._abort_quietly(request.request_id)
            await asyncio.gather(pump, return_exceptions=True)

    def _is_streaming_several(self) -> bool:
        return self._num_inflight > 1

    async def _pump(self, request: GenerateRequest, out: DeltaCoalescer, start: float) -> None:
        """Engine deltas -> ``out`` (an exception is put there too); records the metrics."""
        last = start
        ttft = None
        try:
            async for delta in self._engine.generate(request):
                now = time.monotonic()
                self._last_progress_at = now
                if self._metrics is not None and delta.new_token_ids:
                    if ttft is None:
                        ttft = now - start
                        self._metrics.observe_first_token(ttft)
                    else:
                        self._metrics.observe_delta(now - last, len(delta.new_token_ids))
                last = now
                out.put(delta)
                if delta.finished:
                    if self._metrics is not None:
                        self._metrics.observe_finish(
                            delta.finish_reason or FinishReason.ABORT,
                            delta.num_prompt_tokens,
                            delta.num_completion_tokens,
                            now - start,
                            ttft,
                            num_cached=delta.num_cached_tokens,
                            max_tokens=request.sampling.max_tokens,
                        )
                    return
            out.put_error(RuntimeError(f"engine stream of {request.request_id} ended without finishing"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            out.put_error(exc)

    async def embed(self, request: EmbedRequest, replica_hint: str | None = None) -> EmbeddingResult:
        """The prompt's embedding (an engine without vLLM's pooling runner refuses it naming
        ``model``). ``replica_hint``: as for ``generate``. Cancelling the call aborts the engine
        request. Counted in flight while it runs, as a stream is."""
        del replica_hint
        self._ensure_stats_task()
        self._num_inflight += 1
        try:
            return await self._engine.embed(request)
        except Exception as exc:
            safe = plainly_picklable(exc)
            if safe is exc:
                raise
            raise safe from exc
        finally:
            self._num_inflight -= 1

    async def abort(self, request_id: str) -> None:
        await self._engine.abort(request_id)

    async def _abort_quietly(self, request_id: str) -> None:
        try:
            await asyncio.shield(self._engine.abort(request_id))
        except asyncio.CancelledError:
            pass
        except Exception:
            logger.warning("abort of %s failed", request_id, exc_info=True)

    # -- stats, routing, health ---------------------------------------------------------------

    def stats(self) -> EngineStats:
        return self._engine.stats()

    def metrics_snapshot(self) -> MetricsSnapshot:
        """This replica's ``vllm:*`` (and ``meshserve:*``) series for the ingress's ``GET /metrics``:
        vLLM's own, from its Prometheus stat logger in this process's ``prometheus_client``
        registry (``model_name`` set to the served model's name), or the ones this replica keeps
        for its engine (``EnginePrometheus``)."""
        if self._reads_vllm_registry:
            return registry_snapshot(REGISTRY, "vllm:", with_label("model_name", self.pool.model))
        prom = self._metrics.prom if self._metrics is not None else None
        return prom.snapshot() if prom is not None else MetricsSnapshot()

    def routing_snapshot(self, cursors: Mapping[str, KVCursor] | None = None) -> ReplicaSnapshot:
        """Stats and KV state for one router's poll (by broadcast, so ``cursors`` holds the
        calling router's cursor per replica id; this replica reads its own).

        KV state: the events after the router's cursor while this replica's event log still
        holds them; otherwise (no cursor, a cursor of an earlier incarnation of this replica, or
        one that fell off the log) the full ``kv_block_snapshot()``. Either way the answer
        carries the cursor the router holds once it has applied it, so every router replica
        follows every event, and an answer lost on the way is re-read from the same cursor.

        The engine's pending events are drained into the log first and the new head is taken
        before the snapshot, so the snapshot reflects every event up to that head; events it
        already reflects may come again after it, which is harmless (stored/removed are
        idempotent)."""
        self._ensure_stats_task()
        with self._routing_lock:
            events = self._take_kv_events()
            snap = ReplicaSnapshot(
                self.replica_id,
                self.pool.name,
                self._engine.stats(),
                self._num_inflight,
                self.kv_block_size,
                actor_id=self.actor_id,
            )
            if events is None:
                return snap  # no KV events: the router learns this replica from routing
            head = self._kv_log.append(events)
            cursor = (cursors or {}).get(self.replica_id)
            since = self._kv_log.read(cursor)
            if cursor is None or since is None:
                return dataclasses.replace(
                    snap,
                    publishes_kv_events=True,
                    kv_blocks=self.kv_block_snapshot() or (),
                    kv_block_tiers=self.kv_block_tiers(),
                    kv_cursor=head,
                )
            return dataclasses.replace(
                snap, publishes_kv_events=True, kv_events=since, kv_cursor=head, kv_from_seq=cursor.seq
            )

    @property
    def kv_block_size(self) -> int:
        """Tokens per KV block, the block size of this replica's hashes (the engine's own)."""
        return self._engine.block_size

    def _take_kv_events(self) -> tuple[KVEvent, ...] | None:
        """KV events since the previous call, in the router's hash space; None when the engine
        publishes none (the router then learns this replica from routing)."""
        changes = self._engine.take_kv_events()
        return None if changes is None else kv_events_for_router(changes)

    def kv_block_snapshot(self) -> tuple[int, ...] | None:
        """Block hashes (``accel.block_hash``, ``kv_block_size``) the engine holds in its prefix
        cache now; None when the engine has no snapshot call (``VllmReplica`` overrides this with
        its KV-event subscriber's view)."""
        hashes = self._engine.kv_block_snapshot()
        return None if hashes is None else tuple(hashes)

    def kv_block_tiers(self) -> tuple[tuple[int, Tier], ...]:
        """The blocks of ``kv_block_snapshot`` held only off the device, with their tier (an
        engine with one cache: none; ``VllmReplica`` overrides this)."""
        return ()

    def record_routing_stats(self) -> dict[str, Any]:
        """Polled by Serve (``request_routing_stats_period_s``); shows on ``RunningReplica``."""
        s = self._engine.stats()
        return {
            "pool": self.pool.name,
            "num_running": s.num_running,
            "num_waiting": s.num_waiting,
            "kv_usage": s.kv_usage,
            "num_inflight": self._num_inflight,
        }

    async def check_health(self) -> None:
        """Serve's periodic probe. Fails when the engine's own check fails or does not answer
        within ``pool.step_timeout_s``, or when requests are in flight and the engine has produced
        no output for any of them for longer than that (a hung engine of either kind). A failure
        first ends every in-flight stream with the error (clients get it now, not when Serve has
        replaced the replica), then raises: Serve restarts the replica."""
        self._ensure_stats_task()
        if self._is_shut_down:
            raise RuntimeError("engine is shut down")
        timeout_s = self.pool.step_timeout_s
        try:
            await asyncio.wait_for(self._engine.check_health(), timeout=timeout_s)
            stalled_s = time.monotonic() - self._last_progress_at
            if self._num_inflight > 0 and stalled_s > timeout_s:
                raise RuntimeError(
                    f"no engine output for {stalled_s:.1f} s while {self._num_inflight} request(s) are in "
                    f"flight (step_timeout_s {timeout_s:g})"
                )
        except Exception as exc:
            reason = "the engine health check timed out" if isinstance(exc, asyncio.TimeoutError) else str(exc)
            error = RuntimeError(f"replica {self.replica_id} of pool {self.pool.name!r} is unhealthy: {reason}")
            logger.error("%s; failing %d in-flight request(s)", error, len(self._streams))
            for out in list(self._streams.values()):
                out.put_error(error)
            raise error from exc

    @property
    def is_shut_down(self) -> bool:
        return self._is_shut_down

    async def shutdown(self) -> None:
        if self._is_shut_down:
            return
        self._is_shut_down = True
        if self._stats_task is not None:
            self._stats_task.cancel()
        await self._engine.shutdown()

    def __del__(self) -> Coroutine[Any, Any, None] | None:
        """Serve calls ``__del__`` when it stops the replica and awaits a coroutine it returns:
        the graceful engine shutdown. Sync on purpose: the garbage collector calls it too (after
        Serve did, or on replicas tests built), and an ``async def`` would then leave a coroutine
        never awaited; once shut down (or never started) there is nothing to return."""
        if getattr(self, "_is_shut_down", True):
            return None
        return self.shutdown()

    def _ensure_stats_task(self) -> None:
        if self._stats_task is not None or self._metrics is None:
            return
        try:
            self._stats_task = asyncio.get_running_loop().create_task(self._publish_stats(self._metrics))
        except RuntimeError:
            pass

    async def _publish_stats(self, metrics: EngineMetrics) -> None:
        while True:
            try:
                metrics.observe_stats(self._engine.stats(), self._engine.extra_stats())
            except Exception:
                logger.debug("stats publish failed", exc_info=True)
            await asyncio.sleep(STATS_PERIOD_S)
