"""The router deployment: global routing state shared by every ingress replica.

A thin async wrapper around ``deployments.router.RouterCore`` (prefix index, sessions, load,
policy by config name). Exactly one router replica holds it, so every ingress sees one truth.

Membership, load and KV state come from one mechanism: every ``stats_period_s`` the router
broadcasts ``routing_snapshot(synced_ids)`` to each pool (``DeploymentHandle.broadcast`` reaches
every live replica). A replica that answers for the first time is added to the core at once; one
that no longer answers (dead, drained, scaled down) is removed at once — its index entries,
sessions and in-flight counts go with it. Each answer carries the engine's stats and, for engines
that publish KV events at the model's routing block size (the TT engine; vLLM via its ZMQ events,
``deployments/vllm_kv_subscriber.py``), either the events since the previous poll or — when the
replica is not in ``synced_ids`` (new to this router, a restarted router, or a poll of its pool
was lost) — its full ``kv_block_snapshot()``. Replicas without events, or at another block size,
are learned from routing, even in ``precise`` mode.

Decisions: ``choose(RouteRequest)`` counts the request on the chosen replica(s) before answering
(so a burst cannot pile onto one replica) and returns a ``RouteDecision`` with a ticket; the
ingress streams from the replica itself (tokens never pass through here) and ``release``s the
ticket when the request ends — completion, error and cancel alike. A disaggregated decision has
a second ticket for the prefill phase. Tickets older than ``ticket_ttl_s`` expire (an ingress
that crashed never releases).

A plain class; the builder turns it into a Serve deployment and binds the pool handles.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from deployments.pd_pairing import pairing_problem
from deployments.route_types import (
    PoolInfo, ReplicaSnapshot, ReplicaView, RouteDecision, RouteRequest, RouterSnapshot, eligible_pools,
    routing_block_size,
)
from deployments.router.router_core import (
    NoReplicaError, ReplicaInfo, ReplicaRole, RequestInfo, RouterConfig, RouterCore,
)

logger = logging.getLogger(__name__)

NO_PD = 1 << 62  # pd_min_prompt_tokens when disaggregation is off
PREFILL_SUFFIX = "#prefill"
UNSEEN_POOL_WAIT_S = 0.1  # how long a decision waits for an on-demand poll of an unseen pool


class RouterDeployment:
    def __init__(self, pools: Sequence[PoolInfo], pool_handles: Mapping[str, Any],
                 stats_period_s: float = 0.5, ticket_ttl_s: float = 3600.0,
                 pd_threshold_tokens: int | None = None, core_config: RouterConfig | None = None):
        self._pools = tuple(pools)
        self._pool_by_name = {p.name: p for p in self._pools}
        # model -> block size of its prefix hashes (what the ingress hashes prompts at)
        self._block_sizes = {p.model: routing_block_size(self._pools, p.model) for p in self._pools}
        self._handles = dict(pool_handles)
        self._period_s = stats_period_s
        self._ticket_ttl_s = ticket_ttl_s
        base = core_config or RouterConfig()
        self._core = RouterCore(RouterConfig(
            policy=base.policy, index_mode=base.index_mode,
            block_size=min((p.block_size for p in self._pools), default=base.block_size),
            pd_min_prompt_tokens=NO_PD if pd_threshold_tokens is None else pd_threshold_tokens,
            weights=base.weights, sessions=base.sessions, load=base.load))
        self._roles = {p.name: _core_role(p, self._pools, pd_threshold_tokens) for p in self._pools}
        self._replica_pool: dict[str, str] = {}  # replica id -> pool name (known to the core)
        self._synced: set[str] = set()  # replicas whose KV state the index follows
        self._capacity: dict[str, int] = {}  # replica id -> index capacity in routing blocks
        # ticket -> (request id, replica id or None, is prefill ticket, issue time)
        self._tickets: dict[str, tuple[str, str | None, bool, float]] = {}
        self._poller: asyncio.Task | None = None
        self._pending_refresh: asyncio.Task | None = None  # an on-demand poll (unseen pool)
        self._metrics = None

    # -- decision API -------------------------------------------------------------------------

    async def choose(self, request: RouteRequest) -> RouteDecision:
        """Raises ``RoutingError`` when no pool may serve the request."""
        self._ensure_poller()
        if self._has_unseen_pool(request.model):
            # Serve reports the app ready before the first poll has seen every pool; without this
            # the first requests after start-up would skip PD or a pool. Bounded: the ingress's
            # decision timeout is short, and a slow poll just finishes in the background.
            await asyncio.wait({self._refresh_task()}, timeout=UNSEEN_POOL_WAIT_S)
        return self.decide(request)

    def _has_unseen_pool(self, model: str) -> bool:
        known = set(self._replica_pool.values())
        return any(p.model == model and self._roles[p.name] is not None and p.name not in known
                   for p in self._pools)

    def _refresh_task(self) -> asyncio.Task:
        if self._pending_refresh is None or self._pending_refresh.done():
            self._pending_refresh = asyncio.get_running_loop().create_task(self.refresh())
        return self._pending_refresh

    def decide(self, request: RouteRequest) -> RouteDecision:
        allowed_pools = eligible_pools(request, self._pools)  # RoutingError -> the ingress's 400
        allowed = None
        if request.pool is not None:
            allowed = frozenset(r for r, p in self._replica_pool.items() if p == request.pool)
        info = RequestInfo(request.request_id, request.model, session_key=request.session_id,
                           block_hashes=tuple(request.prompt_block_hashes),
                           num_prompt_tokens_hint=request.num_prompt_tokens, allowed_replicas=allowed,
                           block_size=self._block_sizes[request.model])
        try:
            decision = self._core.route(info)
        except NoReplicaError:  # none known yet (startup): the pool's handle picks
            pool = allowed_pools[0].name
            self._count(pool, "no_replica_known")
            return RouteDecision(pool=pool, replica_id=None, ticket="", reason="no_replica_known")
        pool = self._replica_pool[decision.replica_id]
        ticket = self._issue(request.request_id, decision.replica_id, is_prefill=False)
        if decision.prefill_replica_id is None:
            reason = "pinned" if request.pool is not None else decision.reason
            self._count(pool, reason)
            return RouteDecision(pool=pool, replica_id=decision.replica_id, ticket=ticket, reason=reason)
        prefill = decision.prefill_replica_id
        self._count(pool, "prefill_decode")
        return RouteDecision(pool=pool, replica_id=decision.replica_id, ticket=ticket, reason="prefill_decode",
                             prefill_pool=self._replica_pool[prefill], prefill_replica_id=prefill,
                             prefill_ticket=self._issue(request.request_id, prefill, is_prefill=True))

    def release(self, ticket: str) -> None:
        """The request (or its prefill phase) ended: completed, failed or cancelled. Idempotent."""
        entry = self._tickets.pop(ticket, None)
        if entry is None:
            return
        request_id, replica_id, is_prefill, _ = entry
        if is_prefill:
            self._core.on_prefill_done(request_id, replica_id)
        else:
            self._core.on_completed(request_id)

    def forget(self, request_id: str) -> None:
        """Release every ticket of ``request_id``: the ingress gave up waiting for the decision
        (timeout) and routed locally, so a decision made late must not stay counted."""
        self.release(request_id + PREFILL_SUFFIX)
        self.release(request_id)

    def snapshot(self) -> RouterSnapshot:
        self._ensure_poller()
        views = tuple(ReplicaView(rid, self._replica_pool[rid], self._core.load(rid))
                      for rid in sorted(self._replica_pool))
        return RouterSnapshot(replicas=views, num_open_tickets=len(self._tickets))

    def session_replica(self, session_key: str) -> str | None:
        return self._core.session_replica(session_key)

    @property
    def core(self) -> RouterCore:
        return self._core

    # -- engine replicas ----------------------------------------------------------------------

    async def refresh(self) -> None:
        """Poll every pool once (also what the background loop does)."""
        seen: set[str] = set()
        for pool in self._pools:
            handle = self._handles.get(pool.name)
            if handle is None or self._roles[pool.name] is None:
                continue
            try:
                results = await asyncio.wait_for(
                    handle.broadcast("routing_snapshot", frozenset(self._synced)).results_async(
                        return_exceptions=True),
                    timeout=max(1.0, 4 * self._period_s))
            except Exception as exc:  # a pool still deploying or gone: keep the others
                logger.debug("router: polling pool %s failed: %r", pool.name, exc)
                kept = {r for r, p in self._replica_pool.items() if p == pool.name}
                seen |= kept
                self._synced -= kept  # events may have been lost with the answer: resync
                continue
            for snap in results:
                if isinstance(snap, ReplicaSnapshot):
                    self.apply_snapshot(snap)
                    seen.add(snap.replica_id)
        for replica_id in set(self._replica_pool) - seen:
            self.remove_replica(replica_id)
        self._expire_tickets()
        if self._metrics is not None:
            for pool in self._pools:
                self._metrics.known_replicas.set(
                    sum(1 for p in self._replica_pool.values() if p == pool.name), {"pool": pool.name})

    def apply_snapshot(self, snap: ReplicaSnapshot) -> None:
        """One replica's poll answer: membership, stats and KV state."""
        pool = self._pool_by_name.get(snap.pool)
        role = self._roles.get(snap.pool)
        if pool is None or role is None:
            return
        rid = snap.replica_id
        model_bs = self._block_sizes[pool.model]
        is_precise = snap.publishes_kv_events and snap.block_size == model_bs
        engine_bs = snap.block_size or self._core.config.block_size
        num_blocks = max(1, snap.stats.num_kv_blocks_total * engine_bs // model_bs)
        if self._capacity.get(rid) != num_blocks:  # new, or its KV capacity became known / changed
            self._core.add_replica(ReplicaInfo(rid, (pool.model,), num_blocks, role, publishes_kv_events=is_precise))
            self._replica_pool[rid] = pool.name
            self._capacity[rid] = num_blocks
        self._core.apply_stats(rid, snap.stats)
        if not is_precise:
            self._synced.add(rid)
        elif snap.kv_blocks is not None:
            self._core.apply_snapshot(rid, snap.kv_blocks)
            self._synced.add(rid)
        elif rid in self._synced and snap.kv_events:
            self._core.apply_kv_events(rid, snap.kv_events)

    def remove_replica(self, replica_id: str) -> None:
        """The replica is gone: no more routing there; its index, sessions and load drop now."""
        self._core.remove_replica(replica_id)
        self._replica_pool.pop(replica_id, None)
        self._capacity.pop(replica_id, None)
        self._synced.discard(replica_id)

    async def check_health(self) -> None:
        """Serve's periodic health probe; async so that it runs on the replica's event loop and
        starts the poll loop there even before the first decision (sync methods may run on a
        worker thread without a loop)."""
        self._ensure_poller()
        if self._poller is not None and self._poller.done() and not self._poller.cancelled():
            raise RuntimeError(f"router poll loop died: {self._poller.exception()!r}")

    # -- internals ----------------------------------------------------------------------------

    def _issue(self, request_id: str, replica_id: str, is_prefill: bool) -> str:
        ticket = request_id + (PREFILL_SUFFIX if is_prefill else "")
        self._tickets[ticket] = (request_id, replica_id, is_prefill, time.monotonic())
        return ticket

    def _expire_tickets(self) -> None:
        deadline = time.monotonic() - self._ticket_ttl_s
        for ticket, (_, _, _, issued) in list(self._tickets.items()):
            if issued < deadline:
                self.release(ticket)

    def _count(self, pool: str, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.decisions.inc(1, {"pool": pool, "reason": reason})

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


def _core_role(pool: PoolInfo, pools: Sequence[PoolInfo], pd_threshold_tokens: int | None) -> ReplicaRole | None:
    """The role the core gives a pool's replicas; None = not routed by the core.

    Prefill pools take part only with PD on, when every prefill and decode pool of their model
    shares one KV path (``deployments.pd_pairing``: TPU engines hand KV only to TPU engines that
    load the same connector); otherwise their model's requests run whole on the decode pool."""
    if pool.role == "both":
        return ReplicaRole.BOTH
    if pool.role == "decode":
        return ReplicaRole.DECODE
    if pd_threshold_tokens is None or pairing_problem(pool, pools) is not None:
        return None
    return ReplicaRole.PREFILL
