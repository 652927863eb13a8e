"""``LocalRouterClient``: the router inside the ingress replica (``router.placement: ingress``).

The same ``RouterDeployment`` object the router deployment would run, built in the ingress
process and called on the ingress's event loop: a decision is a coroutine call, not a Serve
call to another process and back, and a release is a method call. On a small host that saves
the CPU of two Serve calls per request on each side and a process's share of the cores
(bench/router_peers --agentic, ours alone, alternating: ingress + router + replica fronts 9.8 / 7.7
against 12.7 / 13.0 CPU-s, TTFT p50 172 / 131 against 224 / 225 ms; docs/BENCHMARKS.md). It
polls the engine replicas and follows their KV events itself, as the deployment does. One ingress
replica only (the config loader refuses more): sessions and in-flight counts live in this process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from deployments.messages.routing import RouteDecision, RouteRequest
from deployments.router.deployment import RouterDeployment
from deployments.telemetry.snapshot import MetricsSnapshot


class LocalRouterClient:
    def __init__(self, router: RouterDeployment):
        self._router = router
        self._tasks: set[asyncio.Task[None]] = set()  # forget / report_dead in flight

    @property
    def router(self) -> RouterDeployment:
        return self._router

    async def choose(self, route: RouteRequest, timeout_s: float) -> RouteDecision:
        """``RouterDeployment.choose``: only an unseen pool's first poll awaits (bounded there by
        ``UNSEEN_POOL_WAIT_S``), so ``timeout_s`` (the remote router's) is not needed here."""
        del timeout_s
        return await self._router.choose(route)

    def release(self, decision: RouteDecision, ticket: str) -> None:
        del decision  # (the remote client's replica hint)
        self._router.release_ticket(ticket)

    def forget(self, request_id: str) -> None:
        self._spawn(self._router.forget(request_id))

    def report_dead(self, replica_id: str | None, actor_id: str | None) -> None:
        self._spawn(self._router.report_dead(replica_id, actor_id))

    async def set_lora_adapter(self, name: str, path: str | None) -> None:
        await self._router.set_lora_adapter(name, path)

    async def lora_adapters(self, timeout_s: float) -> dict[str, str | None]:
        del timeout_s
        return await self._router.lora_adapters()

    async def metrics_snapshots(self, timeout_s: float) -> list[MetricsSnapshot | BaseException]:
        del timeout_s
        return [self._router.metrics_snapshot()]

    async def check_health(self) -> None:
        """The router's own check (starts its poll loop; raises when that loop died), part of the
        ingress replica's health: Serve replaces the replica, router and all."""
        await self._router.check_health()

    def _spawn(self, call: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(call)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
