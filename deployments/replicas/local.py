"""``LocalPoolClient``: a pool whose engine runs inside the calling process (``placement:
ingress``), behind the same calls as ``EnginePoolClient``.

The replica is the same ``EngineReplica`` (``TTMeshReplica`` / ``VllmReplica``) a pool's own
deployment runs — coalescing, metrics, abort on cancel, health — only called directly: a
request's deltas reach the ingress without a Ray message, a pickle and a second event loop per
token. Invariant: one local replica per pool per process, so the pool has exactly one running
replica as this process sees it (the ingress decides ``single_replica``, no router round trip)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator

from accel.contract import EmbeddingResult, EmbedRequest, GenerateRequest, OutputDelta
from deployments.config.app import PoolConfig
from deployments.replicas.engine_replica import EngineFactory, EngineReplica
from deployments.replicas.kv_event_log import DEFAULT_CAPACITY_EVENTS
from deployments.replicas.tt_replica import TTMeshReplica
from deployments.replicas.vllm_replica import VllmReplica
from deployments.telemetry.snapshot import MetricsSnapshot

logger = logging.getLogger(__name__)


def make_replica(
    pool: PoolConfig, engine_factory: EngineFactory | None = None, kv_event_log_size: int = DEFAULT_CAPACITY_EVENTS
) -> EngineReplica:
    """The pool's engine replica, built in this process (what its deployment would run)."""
    cls = TTMeshReplica if pool.engine == "tt" else VllmReplica
    return cls(pool, engine_factory, kv_event_log_size=kv_event_log_size)


class LocalReplicaStream:
    """One in-process ``EngineReplica.generate`` call, as a ``ReplicaStream``."""

    def __init__(self, deltas: AsyncGenerator[OutputDelta, None], closing: set[asyncio.Task[None]]):
        self._deltas = deltas
        self._closing = closing

    def __aiter__(self) -> AsyncIterator[OutputDelta]:
        return self._deltas

    def cancel(self) -> None:
        """Close the call: ``EngineReplica.generate``'s cleanup aborts the engine request (its KV
        blocks freed). Closing a generator that already ended does nothing."""
        task = asyncio.get_running_loop().create_task(self._deltas.aclose())
        self._closing.add(task)  # (a strong reference until it is done)
        task.add_done_callback(self._closing.discard)


class LocalPoolClient:
    def __init__(self, replica: EngineReplica):
        self.replica = replica
        self._closing: set[asyncio.Task[None]] = set()

    def watch(self) -> None:
        pass  # nothing to hear from Serve: the replica is here

    def running_replicas(self) -> frozenset[str] | None:
        return frozenset() if self.replica.is_shut_down else frozenset({self.replica.replica_id})

    def generate(self, request: GenerateRequest, replica_id: str | None) -> LocalReplicaStream:
        del replica_id  # the only replica
        return LocalReplicaStream(self.replica.generate(request), self._closing)

    async def embed(self, request: EmbedRequest, replica_id: str | None) -> EmbeddingResult:
        del replica_id  # the only replica
        return await self.replica.embed(request)

    async def metrics_snapshots(self, timeout_s: float) -> list[MetricsSnapshot | BaseException]:
        del timeout_s  # (a call in this process)
        return [self.replica.metrics_snapshot()]

    async def check_health(self) -> None:
        await self.replica.check_health()

    async def shutdown(self) -> None:
        await asyncio.gather(*self._closing, return_exceptions=True)
        await self.replica.shutdown()
