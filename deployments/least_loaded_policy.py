"""The first routing policy: least-loaded replica among the pools that may serve a request.

Pure logic (no Ray): eligible pools are the explicitly requested one, else every pool of the
model whose role can run a whole request (``both``, or ``decode`` which prefills locally when no
prefill/decode plan is made). Among their replicas the lowest ``ReplicaLoad.load`` wins; ties
go round-robin so equal replicas share work.
"""

from __future__ import annotations

from collections.abc import Sequence

from deployments.route_types import PoolInfo, ReplicaLoad, RouteRequest, RoutingError

WHOLE_REQUEST_ROLES = ("both", "decode")


def eligible_pools(request: RouteRequest, pools: Sequence[PoolInfo]) -> list[PoolInfo]:
    if request.pool is not None:
        pool = next((p for p in pools if p.name == request.pool), None)
        if pool is None:
            raise RoutingError(f"unknown pool {request.pool!r} (pools: {[p.name for p in pools]})",
                               "x-meshserve-pool")
        if pool.model != request.model:
            raise RoutingError(f"pool {pool.name!r} serves {pool.model!r}, not {request.model!r}",
                               "x-meshserve-pool")
        return [pool]
    found = [p for p in pools if p.model == request.model and p.role in WHOLE_REQUEST_ROLES]
    if not found:
        raise RoutingError(f"no pool serves model {request.model!r}", "model")
    return found


class LeastLoadedPolicy:
    def __init__(self):
        self._turn = 0

    def choose(self, request: RouteRequest, pools: Sequence[PoolInfo],
               replicas: Sequence[ReplicaLoad]) -> tuple[str, str | None]:
        """(pool name, replica id or None when no replica of an eligible pool is known)."""
        allowed = eligible_pools(request, pools)
        names = {p.name for p in allowed}
        candidates = [r for r in replicas if r.pool in names]
        if not candidates:
            return allowed[self._next(len(allowed))].name, None
        best = min(r.load for r in candidates)
        tied = sorted((r for r in candidates if r.load == best), key=lambda r: r.replica_id)
        chosen = tied[self._next(len(tied))]
        return chosen.pool, chosen.replica_id

    def _next(self, n: int) -> int:
        self._turn += 1
        return self._turn % n
