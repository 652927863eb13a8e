"""The router deployment: routing state shared by every ingress replica.

A thin async wrapper around ``deployments.router.logic.router_logic.RouterLogic`` (prefix index, sessions, load,
policy by config name). It may run as several replicas (``router.replicas``); they agree:

- **Same engine view.** Every router replica polls every engine replica itself. Membership, load
  and KV state come from one mechanism: every ``stats_period_s`` the router broadcasts
  ``routing_snapshot(cursors)`` to each pool (``DeploymentHandle.broadcast`` reaches every live
  replica). A replica that answers for the first time is added to the logic at once; one that no
  longer answers (dead, drained, scaled down) is removed at once — its index entries, sessions
  and in-flight counts go with it. Each answer carries the engine's stats and, for engines that
  publish KV events at the model's routing block size (the TT engine; vLLM via its ZMQ events,
  ``deployments/replicas/vllm_kv_subscriber.py``), the events after this router's cursor into the
  replica's KV event log (``deployments/replicas/kv_event_log.py``), or — with no usable cursor (new
  replica, restarted router, restarted engine replica, a cursor that fell off the log) — its full
  ``kv_block_snapshot()``, plus the new cursor. The log is read, never drained, by a poll, so
  every router replica applies every event and their precise prefix indexes are identical; a lost
  answer is re-read from the same cursor. Replicas without events, or at another block size, are
  learned from routing, even in ``precise`` mode (that part is per router replica).
- **One owner per session.** The ingress's handle to this deployment routes ``choose`` by
  rendezvous hashing of the request's affinity key (``deployments/router/rendezvous_request_router.py``), so a
  session's binding and in-flight cap live on one router replica; ``release`` goes to the replica
  that issued the ticket (``RouteDecision.router_replica_id``).
- **Load.** Each router counts its own decisions in flight and broadcasts those counts to its
  peers every ``PEER_LOAD_PERIOD_S`` (``peer_load``); what the others have in flight on an
  engine replica is the sum of their fresh counts, weighed like its own, so N routers do not
  each see a busy replica as idle. Without fresh peer counts it falls back to the replica's
  reported ``num_inflight`` minus this router's count (as old as the last poll).
- **Churn at once.** Serve pushes every change of a pool's running replicas to this process's
  handle (our request router publishes it, ``deployments/handle_routing/replica_membership.py``): a replica that
  stopped, was scaled down or failed Serve's health check is removed at once, and a new one
  triggers an immediate poll that adds it with its KV snapshot. The ingress also reports an engine
  replica whose call failed because its actor died (``report_dead``, broadcast to every router
  replica), which can come before Serve notices. The periodic poll remains the backstop (a
  replica that stops answering is dropped; one that answers again is re-added).

Decisions: ``choose(RouteRequest)`` counts the request on the chosen replica(s) before answering
(so a burst cannot pile onto one replica) and returns a ``RouteDecision`` with a ticket; the
ingress streams from the replica itself (tokens never pass through here) and ``release``s the
ticket when the request ends — completion, error and cancel alike. A disaggregated decision has
a second ticket for the prefill phase. Tickets older than ``ticket_ttl_s`` expire (an ingress
that crashed never releases).

Every method Serve calls is ``async``: they all run on the replica's event loop, one at a time
between awaits, so ``RouterLogic`` (not thread-safe) is never entered from Serve's thread pool.

A plain class; the builder turns it into a Serve deployment and binds the pool handles. What the
polls and Serve's pushes say about the engine replicas is kept and applied to the logic by
``deployments.router.engine_view.EngineView`` (``self.engines``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ray import serve

from deployments.config.app import AppConfig
from deployments.handle_routing import replica_membership
from deployments.messages.routing import RouteDecision, RouteRequest, eligible_pools, prefill_ticket_of
from deployments.replicas.client import EnginePoolClient
from deployments.replicas.engine_replica import current_replica_id
from deployments.router.engine_view import EngineView
from deployments.router.logic.load import PEER_LOAD_PERIOD_S
from deployments.router.logic.router_logic import NoReplicaError, RouterLogic
from deployments.router.views import IndexView, ReplicaView, RouterSnapshot
from deployments.telemetry.metrics import RouterMetrics
from deployments.telemetry.snapshot import MetricsSnapshot

logger = logging.getLogger(__name__)

TICKET_TTL_S = 3600.0  # a ticket never released (its ingress crashed) expires after this
UNSEEN_POOL_WAIT_S = 0.1  # how long a decision waits for an on-demand poll of an unseen pool


class RouterDeployment:
    def __init__(self, config: AppConfig, pool_handles: Mapping[str, Any], ticket_ttl_s: float = TICKET_TTL_S):
        """``pool_handles``: pool name -> the pool's engine deployment handle (bound by the builder)."""
        self.replica_id = current_replica_id()
        self._num_router_replicas = config.router.replicas
        self._pools = config.pools
        self._pool_clients = {name: EnginePoolClient(handle) for name, handle in pool_handles.items()}
        self._period_s = config.router.stats_period_s
        self._ticket_ttl_s = ticket_ttl_s
        self._logic = RouterLogic(config.router, {m.name: m.routing for m in config.models})
        self.engines = EngineView(self._logic, config.models)
        # ticket -> (request id, replica id, is prefill ticket, issue time)
        self._tickets: dict[str, tuple[str, str, bool, float]] = {}
        self._poller: asyncio.Task[None] | None = None
        self._pending_refresh: asyncio.Task[None] | None = None  # an on-demand poll (unseen pool)
        self._unsubscribe: list[Any] = []  # replica_membership subscriptions
        self._gossip: asyncio.Task[None] | None = None  # publishes our in-flight counts to peer routers
        self._metrics: RouterMetrics | None = None
        # LoRA adapters loaded (path) or unloaded (None) at run time through some ingress replica,
        # in that order: every ingress replica syncs its set from here (serve_app.http.lora_adapters).
        self._runtime_adapters: dict[str, str | None] = {}

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
        known = set(self.engines.replica_pool.values())
        return any(p.model == model and self.engines.is_routed(p.name) and p.name not in known for p in self._pools)

    def _refresh_task(self) -> asyncio.Task[None]:
        if self._pending_refresh is None or self._pending_refresh.done():
            self._pending_refresh = asyncio.get_running_loop().create_task(self.refresh())
        return self._pending_refresh

    def decide(self, request: RouteRequest) -> RouteDecision:
        allowed_pools = eligible_pools(request, self._pools)  # RoutingError -> the ingress's 400
        try:
            decision = self._logic.route(request)
        except NoReplicaError:  # none known yet (startup): the pool's handle picks
            pool = allowed_pools[0].name
            self._count(pool, "no_replica_known")
            return RouteDecision(
                pool=pool, replica_id=None, ticket="", reason="no_replica_known", router_replica_id=self.replica_id
            )
        assert decision.replica_id is not None
        self._issue(decision.ticket, request.request_id, decision.replica_id, is_prefill=False)
        if decision.prefill_replica_id is not None:
            self._issue(decision.prefill_ticket, request.request_id, decision.prefill_replica_id, is_prefill=True)
        self._count(decision.pool, decision.reason)
        return dataclasses.replace(decision, router_replica_id=self.replica_id)

    async def release(self, ticket: str, replica_hint: str | None = None) -> None:
        """The request (or its prefill phase) ended: completed, failed or cancelled. Idempotent.
        ``replica_hint`` (this router replica's id) is read by the handle's request router."""
        del replica_hint
        self.release_ticket(ticket)

    def release_ticket(self, ticket: str) -> None:
        """``release`` for a caller in this process (the router inside the ingress)."""
        entry = self._tickets.pop(ticket, None)
        if entry is None:
            return
        request_id, replica_id, is_prefill, _ = entry
        if is_prefill:
            self._logic.on_prefill_done(request_id, replica_id)
        else:
            self._logic.on_completed(request_id)

    async def forget(self, request_id: str) -> None:
        """Release every ticket of ``request_id``: the ingress gave up waiting for the decision
        (timeout) and routed locally, so a decision made late must not stay counted. (Sent to
        every router replica: the ingress does not know which one decided.)"""
        self.release_ticket(prefill_ticket_of(request_id))
        self.release_ticket(request_id)

    async def set_lora_adapter(self, name: str, path: str | None) -> None:
        """An ingress replica loaded (``path``) or unloaded (None) LoRA adapter ``name`` at run time."""
        self._runtime_adapters.pop(name, None)  # (re)loaded last: vLLM lists adapters in load order
        self._runtime_adapters[name] = path

    async def lora_adapters(self) -> dict[str, str | None]:
        """The latest runtime load or unload of every adapter name, oldest first."""
        return dict(self._runtime_adapters)

    async def snapshot(self) -> RouterSnapshot:
        self._ensure_poller()
        replica_pool = self.engines.replica_pool
        views = tuple(ReplicaView(rid, replica_pool[rid], self._logic.load(rid)) for rid in sorted(replica_pool))
        return RouterSnapshot(
            replicas=views,
            num_open_tickets=len(self._tickets),
            router_replica_id=self.replica_id,
            peer_router_ids=self._logic.peer_router_ids(),
        )

    async def session_replica(self, session_id: str) -> str | None:
        return self._logic.session_replica(session_id)

    async def prefix_index_view(self, probe_hashes: Sequence[int]) -> IndexView:
        """Which of ``probe_hashes`` this router's prefix index holds per engine replica, and how
        many blocks it holds in all (tests compare router replicas with each other and with the
        engines' own block lists)."""
        index = self._logic.index
        held = tuple(
            sorted(
                (rid, tuple(h for h in probe_hashes if index.holds(rid, h)), index.num_blocks(rid))
                for rid in self.engines.replica_pool
            )
        )
        return IndexView(router_replica_id=self.replica_id, replicas=held)

    @property
    def logic(self) -> RouterLogic:
        return self._logic

    # -- engine replicas ----------------------------------------------------------------------

    async def refresh(self) -> None:
        """Poll every pool once (also what the background loop does)."""
        engines = self.engines
        seen: set[str] = set()
        started_s = time.monotonic()
        for pool in self._pools:
            client = self._pool_clients.get(pool.name)
            if client is None or not engines.is_routed(pool.name):
                continue
            try:
                results = await asyncio.wait_for(
                    client.routing_snapshots(engines.cursors), timeout=max(1.0, 4 * self._period_s)
                )
            except Exception as exc:  # a pool still deploying or gone: keep the others
                logger.debug("router: polling pool %s failed: %r", pool.name, exc)
                # Keep its replicas and cursors: a lost answer is re-read from the same cursor.
                seen |= engines.replicas_of(pool.name)
                continue
            seen |= engines.apply_poll(results, started_s)
        for replica_id in set(engines.replica_pool) - seen:
            engines.remove(replica_id)
        engines.end_poll_round(started_s)
        self._expire_tickets()
        if self._metrics is not None:
            counts = engines.num_replicas_by_pool()
            for pool in self._pools:
                self._metrics.sees(pool.name, counts.get(pool.name, 0))

    def metrics_snapshot(self) -> MetricsSnapshot:
        """This router replica's ``meshserve:router_*`` series, for the ingress's ``GET /metrics``."""
        return self._metrics.prom.snapshot() if self._metrics is not None else MetricsSnapshot()

    async def peer_load(self, router_replica_id: str, counts: Mapping[str, int]) -> None:
        """A peer router replica's requests in flight per engine replica (broadcast every
        ``PEER_LOAD_PERIOD_S`` by each router replica; our own broadcast is ignored)."""
        if router_replica_id != self.replica_id:
            self._logic.apply_peer_in_flight(router_replica_id, counts)

    async def _publish_load_forever(self) -> None:
        """Several router replicas: tell the others what this one has in flight, so each sees the
        whole load between engine polls (fire and forget; a lost round is replaced by the next)."""
        context = serve.get_replica_context()
        handle = serve.get_deployment_handle(context.deployment, context.app_name)
        pending = None
        while True:
            await asyncio.sleep(PEER_LOAD_PERIOD_S)
            if pending is not None and not pending.done():
                continue  # the previous round is still out (a slow peer): skip, never pile up
            pending = asyncio.ensure_future(self._publish_load_once(handle, self._logic.in_flight_counts()))

    async def _publish_load_once(self, handle: Any, counts: dict[str, int]) -> None:
        try:
            response = handle.broadcast(RouterDeployment.peer_load.__name__, self.replica_id, counts)
            await response.results_async(return_exceptions=True)
        except Exception:  # a peer starting or gone: the next round tries again
            logger.debug("router: publishing in-flight counts failed", exc_info=True)

    async def report_dead(self, replica_id: str | None, actor_id: str | None = None) -> None:
        """An ingress saw a call to an engine replica fail because its actor died: stop routing
        there now (its index entries, sessions and load go). ``actor_id`` (from the error) names
        the replica exactly when this router knows it; else ``replica_id`` (the replica the
        decision named). Answers of polls already under way are ignored; a later poll re-adds
        the replica if it answers."""
        rid = self.engines.replica_of_actor(actor_id) or replica_id
        if rid is None or rid not in self.engines.replica_pool:
            return
        logger.warning("router: engine replica %s reported dead; removed", rid)
        self.engines.drop(rid)

    def on_membership(self, pool_name: str, running_ids: frozenset[str]) -> None:
        """Serve pushed the running replicas of a pool (``deployments.handle_routing.replica_membership``):
        replicas no longer running are removed at once (answers of polls sent before are ignored);
        new ones trigger a poll now, which adds them with their stats and KV state."""
        known = self.engines.replicas_of(pool_name)
        for rid in known - running_ids:
            logger.info("router: engine replica %s left pool %s; removed", rid, pool_name)
            self.engines.drop(rid)
        if running_ids - known and self.engines.is_routed(pool_name):
            self._refresh_task()

    def _subscribe_membership(self, loop: asyncio.AbstractEventLoop) -> None:
        for pool in self._pools:
            client = self._pool_clients.get(pool.name)
            deployment = client.deployment if client is not None else None
            if deployment is None or not self.engines.is_routed(pool.name):
                continue
            app_name, name = deployment

            def listener(ids: frozenset[str], pool_name: str = pool.name) -> None:
                # called on Serve's router thread: hand over to this replica's loop
                loop.call_soon_threadsafe(self.on_membership, pool_name, ids)

            self._unsubscribe.append(replica_membership.subscribe(app_name, name, listener))

    async def check_health(self) -> None:
        """Serve's periodic health probe; async so that it runs on the replica's event loop and
        starts the poll loop there even before the first decision (sync methods may run on a
        worker thread without a loop)."""
        self._ensure_poller()
        for name, task in (("poll", self._poller), ("peer load", self._gossip)):
            if task is not None and task.done() and not task.cancelled():
                raise RuntimeError(f"router {name} loop died: {task.exception()!r}")

    # -- internals ----------------------------------------------------------------------------

    def _issue(self, ticket: str, request_id: str, replica_id: str, is_prefill: bool) -> None:
        self._tickets[ticket] = (request_id, replica_id, is_prefill, time.monotonic())

    def _expire_tickets(self) -> None:
        deadline = time.monotonic() - self._ticket_ttl_s
        for ticket, (_, _, _, issued) in list(self._tickets.items()):
            if issued < deadline:
                self.release_ticket(ticket)

    def _count(self, pool: str, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.decided(pool, reason)

    def _ensure_poller(self) -> None:
        if self._poller is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._metrics is None:
            try:
                self._metrics = RouterMetrics()
            except Exception:  # outside a Ray worker (unit tests)
                self._metrics = None
        self._poller = loop.create_task(self._poll_forever())
        self._subscribe_membership(loop)
        if self._num_router_replicas > 1:
            self._gossip = loop.create_task(self._publish_load_forever())

    async def _poll_forever(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:
                logger.exception("router: refresh failed")
            await asyncio.sleep(self._period_s)
