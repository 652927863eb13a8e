"""The typed messages between the ingress, the router deployment and the engine replicas.

The router's decision API is deliberately small: ``RouteRequest`` in, ``RouteDecision`` out,
``release(ticket)`` when the request ends. A smarter policy (``deployments/router``) replaces
the policy behind it without changing these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from accel.contract import EngineStats


@dataclass(frozen=True)
class PoolInfo:
    """What the router needs to know about a pool (from the app config)."""

    name: str
    model: str
    engine: str        # "tt" | "vllm"
    accelerator: str   # "tt" | "tpu" | "cuda" | "cpu"
    role: str          # "both" | "prefill" | "decode"


@dataclass(frozen=True)
class RouteRequest:
    """One engine request to place. ``pool`` set = the client pinned a pool (x-meshserve-pool)."""

    request_id: str
    model: str
    num_prompt_tokens: int
    pool: str | None = None
    session_id: str | None = None
    # Chained block hashes of the prompt (accel.block_hash), for prefix-aware policies; may be empty.
    prompt_block_hashes: tuple[int, ...] = ()


@dataclass(frozen=True)
class RouteDecision:
    """Where to send it. ``replica_id`` None = the router knows no replica of ``pool`` yet; the
    engine handle then picks the least-loaded one itself. ``ticket`` goes back in ``release``."""

    pool: str
    replica_id: str | None
    ticket: str
    reason: str
    # Prefill/decode disaggregation (deployments/pd_plan.py): set when the prompt is prefilled on
    # ``prefill_pool`` and decoded on ``pool``; ``prefill_ticket`` is released when prefill ends.
    prefill_pool: str | None = None
    prefill_replica_id: str | None = None
    prefill_ticket: str = ""


@dataclass(frozen=True)
class ReplicaSnapshot:
    """An engine replica's self-report (``routing_snapshot``), polled by the router."""

    replica_id: str
    pool: str
    stats: EngineStats
    num_inflight: int  # requests inside the replica's generate() right now


@dataclass(frozen=True)
class ReplicaLoad:
    """The router's view of one replica: its last snapshot plus decisions not yet released."""

    replica_id: str
    pool: str
    num_routed_inflight: int
    snapshot: ReplicaSnapshot | None = None

    @property
    def load(self) -> float:
        """Requests on the replica: the router's own live count, or the replica's (lagging)
        report when that is higher (other routers' traffic), plus a KV-pressure tie-break."""
        reported = 0 if self.snapshot is None else (self.snapshot.stats.num_waiting
                                                    + self.snapshot.stats.num_running)
        kv = 0.0 if self.snapshot is None else self.snapshot.stats.kv_usage
        return max(self.num_routed_inflight, reported) + 0.5 * kv


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

    replicas: tuple[ReplicaLoad, ...] = field(default_factory=tuple)
    num_open_tickets: int = 0
