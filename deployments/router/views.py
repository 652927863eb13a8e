"""Debug and test views of a router replica's state (never on the request path)."""

from __future__ import annotations

from dataclasses import dataclass, field

from deployments.router.logic.load import ReplicaLoad


@dataclass(frozen=True)
class ReplicaView:
    """Debug / test view of one replica in the router: its pool and the router's load model."""

    replica_id: str
    pool: str
    load: ReplicaLoad


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
