"""The typed messages between the ingress, the router deployment and the engine replicas.

The router's decision API is deliberately small: ``RouteRequest`` in, ``RouteDecision`` out,
``release(ticket)`` when the request ends (completed, failed or cancelled). The router core
(``deployments.router.core.router_core.RouterCore``) takes and returns these same types, so a
request has one shape from the ingress to the decision (pools by name).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from accel.block_hash import BlockHash
from accel.contract import EngineStats
from deployments.replicas.kv_event_log import KVCursor
from deployments.router.core.load import ReplicaLoad
from deployments.router.kv_events import KVEvent
from serve_app.config.app import PoolConfig


@dataclass(frozen=True)
class RouteRequest:
    """One engine request to place (what ``RouterCore.route`` takes). ``pool`` set = the client
    pinned a pool (x-meshserve-pool)."""

    request_id: str
    model: str
    num_prompt_tokens: int
    pool: str | None = None
    session_id: str | None = None  # GenerateRequest.session_id: binds the request's session
    # Chained block hashes of the prompt's full blocks (accel.block_hash.hash_prompt_blocks at
    # the model's ModelConfig.routing_block_size); may be empty.
    prompt_block_hashes: tuple[BlockHash, ...] = ()
    # Engine replicas not to choose (a retry after the first choice died).
    excluded_replicas: tuple[str, ...] = ()

    @property
    def affinity_key(self) -> str:
        """Which router replica decides this request (``deployments.router.rendezvous_request_router``):
        every request of a session, else of a prompt head, goes to the same one, so its session
        binding and in-flight counts live in one place."""
        if self.session_id:
            return "s:" + self.session_id
        if self.prompt_block_hashes:
            return f"b:{self.prompt_block_hashes[0]}"
        return "r:" + self.request_id


PREFILL_TICKET_SUFFIX = "#prefill"  # a disaggregated decision's prefill ticket: request id + this


def prefill_ticket_of(request_id: str) -> str:
    return request_id + PREFILL_TICKET_SUFFIX


@dataclass(frozen=True)
class RouteDecision:
    """Where to send it (what ``RouterCore.route`` returns). ``replica_id`` None = the router knows
    no replica of ``pool`` yet; the engine handle then picks the least-loaded one itself.
    ``ticket`` (the request id) goes back in ``release``, to ``router_replica_id`` (the router
    replica that issued it and counts the request); "" = nothing to release."""

    pool: str
    replica_id: str | None
    ticket: str
    reason: str  # "pinned", "prefill_decode", a policy's reason (``policy.Choice``), or a fallback's
    # Prefill/decode disaggregation (deployments/pd/orchestrator.py): set when the prompt is prefilled on
    # ``prefill_pool`` and decoded on ``pool``; ``prefill_ticket`` is released when prefill ends.
    prefill_pool: str | None = None
    prefill_replica_id: str | None = None
    prefill_ticket: str = ""
    router_replica_id: str | None = None
    num_matched_blocks: int = 0  # leading prompt blocks cached on the replica doing the prefill
    num_prompt_blocks: int = 0  # full blocks of the prompt

    @property
    def is_disaggregated(self) -> bool:
        return self.prefill_pool is not None


@dataclass(frozen=True)
class ReplicaSnapshot:
    """An engine replica's self-report (``routing_snapshot``), polled by every router replica.

    KV state for the router's prefix index, in ``accel.block_hash`` keys at ``block_size``:
    ``kv_blocks`` is the replica's full cached-block list (the router had no usable cursor into
    this replica's event log), otherwise ``kv_events`` are the events after the router's cursor
    (seq ``kv_from_seq``). ``kv_cursor`` is the router's cursor once it has applied either.
    ``publishes_kv_events`` False = neither is available (the router learns that replica from
    routing)."""

    replica_id: str
    pool: str
    stats: EngineStats
    num_inflight: int  # requests inside the replica's generate() right now
    block_size: int = 0  # engine KV block size in tokens (0 = unknown)
    publishes_kv_events: bool = False
    kv_events: tuple[KVEvent, ...] = ()
    kv_blocks: tuple[int, ...] | None = None
    kv_cursor: KVCursor | None = None
    kv_from_seq: int = 0
    actor_id: str | None = None  # the replica's Ray actor id (matches RayActorError.actor_id)


@dataclass(frozen=True)
class ReplicaView:
    """Debug / test view of one replica in the router: its pool and the router's load model."""

    replica_id: str
    pool: str
    load: ReplicaLoad


class RoutingError(Exception):
    """A request the router cannot place (unknown pool, pool serving another model).
    ``param`` names the offending request field for the 400."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True)
class RouterSnapshot:
    """Debug / test view of the router's state."""

    replicas: tuple[ReplicaView, ...] = field(default_factory=tuple)
    num_open_tickets: int = 0
    router_replica_id: str | None = None
    peer_router_ids: tuple[str, ...] = ()  # router replicas whose in-flight counts are fresh here


@dataclass(frozen=True)
class IndexView:
    """Test view of one router replica's prefix index: per engine replica (sorted by id), the
    probed block hashes it holds and its total number of indexed blocks."""

    router_replica_id: str | None
    replicas: tuple[tuple[str, tuple[int, ...], int], ...]


WHOLE_REQUEST_ROLES = ("both", "decode")


def eligible_pools(request: RouteRequest, pools: Sequence[PoolConfig]) -> list[PoolConfig]:
    """Pools that may run the whole request: the pinned one, else every pool of the model whose
    role can (``both``, or ``decode``, which prefills locally when no PD plan is made).
    Raises ``RoutingError`` for an unknown pin, a pin to another model, or an unserved model."""
    if request.pool is not None:
        pool = next((p for p in pools if p.name == request.pool), None)
        if pool is None:
            raise RoutingError(f"unknown pool {request.pool!r} (pools: {[p.name for p in pools]})", "x-meshserve-pool")
        if pool.model != request.model:
            raise RoutingError(f"pool {pool.name!r} serves {pool.model!r}, not {request.model!r}", "x-meshserve-pool")
        return [pool]
    found = [p for p in pools if p.model == request.model and p.role in WHOLE_REQUEST_ROLES]
    if not found:
        raise RoutingError(f"no pool serves model {request.model!r}", "model")
    return found
