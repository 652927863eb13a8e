"""``EnginePoolClient``: typed calls to one pool's engine replicas (``EngineReplica``) over the
pool's Serve handle, for the ingress (stream a request from the chosen replica) and the router
(poll every replica). Method names come from ``EngineReplica`` itself."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from accel.contract import EmbeddingResult, EmbedRequest, GenerateRequest, OutputDelta
from deployments.handle_routing import replica_membership
from deployments.messages.kv_events import KVCursor
from deployments.messages.replica_snapshot import ReplicaSnapshot
from deployments.replicas.engine_replica import EngineReplica
from deployments.telemetry.snapshot import MetricsSnapshot, broadcast_snapshots


class ReplicaStream(Protocol):
    """One replica call's deltas (Serve's ``DeploymentResponseGenerator``); ``cancel`` stops the
    call, which aborts the engine request there."""

    def __aiter__(self) -> AsyncIterator[OutputDelta]: ...

    def cancel(self) -> None: ...


class PoolClient(Protocol):
    """What the ingress calls on a pool: ``EnginePoolClient`` (the pool's own deployment) or
    ``local.LocalPoolClient`` (its engine inside the ingress process)."""

    def watch(self) -> None: ...

    def running_replicas(self) -> frozenset[str] | None: ...

    def generate(self, request: GenerateRequest, replica_id: str | None) -> ReplicaStream: ...

    async def embed(self, request: EmbedRequest, replica_id: str | None) -> EmbeddingResult: ...


class EnginePoolClient:
    def __init__(self, handle: Any, by_value: bool = False):
        """``handle``: the pool's engine deployment ``DeploymentHandle`` (bound by the builder).
        ``by_value``: stream over Serve's gRPC path (``ingress.handle_transport: grpc``) instead of
        Ray actor calls whose every streamed item is an object ref."""
        self._handle = handle
        self._by_value = by_value
        self._streaming: Any = None  # the handle with stream=True, made on first use

    @property
    def deployment(self) -> tuple[str, str] | None:
        """(app name, deployment name) of the handle, when it is a real Serve handle."""
        app, name = getattr(self._handle, "app_name", None), getattr(self._handle, "deployment_name", None)
        return (app, name) if isinstance(app, str) and isinstance(name, str) else None

    def watch(self) -> None:
        """Start hearing of the pool's running replicas now (``running_replicas``), not at the first
        request: making the streaming handle starts its request router's long poll."""
        if self._streaming is None and self.deployment is not None:
            self._streaming_handle()

    def running_replicas(self) -> frozenset[str] | None:
        """The pool's running replicas as Serve last told this process (None: not heard yet, or
        not a Serve handle)."""
        deployment = self.deployment
        return None if deployment is None else replica_membership.latest(*deployment)

    def _streaming_handle(self) -> Any:
        if self._streaming is None:
            # Plain (C) pickle for the token stream: cloudpickle, Serve's default, costs ~10x more
            # per OutputDelta (engine replicas raise only plainly picklable errors: engine_replica.py).
            self._streaming = self._handle.options(
                stream=True,
                request_serialization="pickle",
                response_serialization="pickle",
                _by_reference=not self._by_value,
            )
        return self._streaming

    def generate(self, request: GenerateRequest, replica_id: str | None) -> ReplicaStream:
        """``EngineReplica.generate`` on ``replica_id`` (the handle's ``PinnedReplicaRequestRouter``
        reads the hint; None = the least-loaded replica)."""
        stream: ReplicaStream = self._streaming_handle().generate.remote(request, replica_hint=replica_id)
        return stream

    async def embed(self, request: EmbedRequest, replica_id: str | None) -> EmbeddingResult:
        """``EngineReplica.embed`` on ``replica_id`` (None = the least-loaded replica); cancelling
        the caller cancels the call."""
        result: EmbeddingResult = await self._handle.embed.remote(request, replica_hint=replica_id)
        return result

    async def routing_snapshots(self, cursors: Mapping[str, KVCursor]) -> list[ReplicaSnapshot | BaseException]:
        """``EngineReplica.routing_snapshot(cursors)`` of every live replica of the pool; a replica
        whose call failed answers with its exception."""
        response = self._handle.broadcast(EngineReplica.routing_snapshot.__name__, dict(cursors))
        answers: list[ReplicaSnapshot | BaseException] = await response.results_async(return_exceptions=True)
        return answers

    async def metrics_snapshots(self, timeout_s: float) -> list[MetricsSnapshot | BaseException]:
        """``EngineReplica.metrics_snapshot()`` of every live replica of the pool (``GET /metrics``)."""
        return await broadcast_snapshots(self._handle, EngineReplica.metrics_snapshot.__name__, timeout_s)
