"""The router deployment: global routing state shared by every ingress replica.

It learns the engine replicas (membership and load) by polling each pool's
``routing_snapshot`` through ``DeploymentHandle.broadcast`` every ``stats_period_s``, counts
the requests it placed until the ingress releases them, and answers ``choose`` with a
``RouteDecision``. Tokens never pass through it: the ingress calls the chosen replica directly.

A plain class; the builder turns it into a Serve deployment and binds the pool handles.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from deployments.least_loaded_policy import LeastLoadedPolicy
from deployments.pd_plan import plan_pd
from deployments.route_types import (
    PoolInfo, ReplicaLoad, ReplicaSnapshot, RouteDecision, RouteRequest, RouterSnapshot,
)

logger = logging.getLogger(__name__)


class RouterDeployment:
    def __init__(self, pools: Sequence[PoolInfo], pool_handles: Mapping[str, Any],
                 stats_period_s: float = 0.5, ticket_ttl_s: float = 3600.0,
                 pd_threshold_tokens: int | None = None):
        self._pools = tuple(pools)
        self._pd_threshold_tokens = pd_threshold_tokens
        self._handles = dict(pool_handles)
        self._period_s = stats_period_s
        self._ticket_ttl_s = ticket_ttl_s
        self._policy = LeastLoadedPolicy()
        self._snapshots: dict[str, ReplicaSnapshot] = {}
        self._inflight: dict[str, int] = {}
        # ticket -> (replica id or None, issue time); expired tickets are dropped (a crashed
        # ingress never releases) so the count cannot drift upward forever.
        self._tickets: dict[str, tuple[str | None, float]] = {}
        self._ids = itertools.count()
        self._poller: asyncio.Task | None = None
        self._metrics = None

    # -- decision API -------------------------------------------------------------------------

    async def choose(self, request: RouteRequest) -> RouteDecision:
        """Raises ``RoutingError`` when no pool may serve the request."""
        self._ensure_poller()
        pd = plan_pd(request, self._pools, self._loads(), self._pd_threshold_tokens)
        if pd is not None:
            (prefill_pool, prefill_replica), (pool, replica_id) = pd
        else:
            prefill_pool = prefill_replica = None
            pool, replica_id = self._policy.choose(request, self._pools, self._loads())
        ticket = self._issue_ticket(replica_id)
        reason = ("no_replica_known" if replica_id is None else "pinned" if request.pool else
                  "prefill_decode" if pd is not None else "least_loaded")
        if self._metrics is not None:
            self._metrics.decisions.inc(1, {"pool": pool, "reason": reason})
        return RouteDecision(pool=pool, replica_id=replica_id, ticket=ticket, reason=reason,
                             prefill_pool=prefill_pool, prefill_replica_id=prefill_replica,
                             prefill_ticket=self._issue_ticket(prefill_replica) if pd is not None else "")

    def _issue_ticket(self, replica_id: str | None) -> str:
        ticket = f"t{next(self._ids)}"
        self._tickets[ticket] = (replica_id, time.monotonic())
        if replica_id is not None:
            self._inflight[replica_id] = self._inflight.get(replica_id, 0) + 1
        return ticket

    def release(self, ticket: str) -> None:
        entry = self._tickets.pop(ticket, None)
        if entry is not None and entry[0] is not None and entry[0] in self._inflight:
            self._inflight[entry[0]] = max(0, self._inflight[entry[0]] - 1)

    def snapshot(self) -> RouterSnapshot:
        self._ensure_poller()
        return RouterSnapshot(replicas=tuple(self._loads()), num_open_tickets=len(self._tickets))

    async def refresh(self) -> None:
        """Poll every pool once (also what the background loop does)."""
        seen: dict[str, ReplicaSnapshot] = {}
        for pool in self._pools:
            handle = self._handles.get(pool.name)
            if handle is None:
                continue
            try:
                results = await asyncio.wait_for(
                    handle.broadcast("routing_snapshot").results_async(return_exceptions=True),
                    timeout=max(1.0, 4 * self._period_s))
            except Exception as exc:  # a pool still deploying or gone: keep the others
                logger.debug("router: polling pool %s failed: %r", pool.name, exc)
                seen.update({k: v for k, v in self._snapshots.items() if v.pool == pool.name})
                continue
            for snap in results:
                if isinstance(snap, ReplicaSnapshot):
                    seen[snap.replica_id] = snap
        self._snapshots = seen
        # Forget counts of replicas that are gone; expire stale tickets.
        self._inflight = {rid: n for rid, n in self._inflight.items() if rid in seen}
        deadline = time.monotonic() - self._ticket_ttl_s
        for ticket, (rid, issued) in list(self._tickets.items()):
            if issued < deadline:
                self.release(ticket)
        if self._metrics is not None:
            for pool in self._pools:
                self._metrics.known_replicas.set(
                    sum(1 for s in seen.values() if s.pool == pool.name), {"pool": pool.name})

    def check_health(self) -> None:
        self._ensure_poller()
        if self._poller is not None and self._poller.done() and not self._poller.cancelled():
            raise RuntimeError(f"router poll loop died: {self._poller.exception()!r}")

    # -- internals ----------------------------------------------------------------------------

    def _loads(self) -> list[ReplicaLoad]:
        return [ReplicaLoad(rid, snap.pool, self._inflight.get(rid, 0), snap)
                for rid, snap in sorted(self._snapshots.items())]

    def _ensure_poller(self) -> None:
        if self._poller is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._metrics is None:
            try:
                from serve_app.metrics import RouterMetrics
                self._metrics = RouterMetrics()
            except Exception:  # outside a Ray worker (unit tests)
                self._metrics = None
        self._poller = loop.create_task(self._poll_forever())

    async def _poll_forever(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:
                logger.exception("router: refresh failed")
            await asyncio.sleep(self._period_s)
