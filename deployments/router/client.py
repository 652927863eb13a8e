"""``RouterClient``: the ingress's typed calls to the router deployment, over its Serve handle.

Which router replica each call reaches (several router replicas, ``router.replicas``):
``choose`` goes to the replica that owns the request's affinity key (the handle's
``RendezvousRequestRouter``); ``release`` to the replica that issued the ticket
(``replica_hint``); ``forget`` and ``report_dead`` to every replica (broadcast, in the background:
control messages that must not delay the request). Method names come from ``RouterDeployment``
itself, so renaming a method there cannot leave a caller behind.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from deployments.config.app import AppConfig
from deployments.messages.routing import RouteDecision, RouteRequest
from deployments.router.deployment import RouterDeployment
from deployments.router.local_client import LocalRouterClient
from deployments.telemetry.snapshot import MetricsSnapshot, broadcast_snapshots

logger = logging.getLogger(__name__)

CONTROL_TIMEOUT_S = 10.0  # a broadcast control message to the routers gives up after this


class RouterCalls(Protocol):
    """What the ingress calls on the router: ``RouterClient`` (the router deployment, over Serve)
    or ``local_client.LocalRouterClient`` (a router inside the ingress, ``router.placement: ingress``)."""

    async def choose(self, route: RouteRequest, timeout_s: float) -> RouteDecision: ...

    def release(self, decision: RouteDecision, ticket: str) -> None: ...

    def forget(self, request_id: str) -> None: ...

    def report_dead(self, replica_id: str | None, actor_id: str | None) -> None: ...

    async def set_lora_adapter(self, name: str, path: str | None) -> None: ...

    async def lora_adapters(self, timeout_s: float) -> dict[str, str | None]: ...

    async def metrics_snapshots(self, timeout_s: float) -> list[MetricsSnapshot | BaseException]: ...

    async def check_health(self) -> None: ...


def router_calls(config: AppConfig, handle: Any, pool_handles: Mapping[str, Any], by_value: bool) -> RouterCalls:
    """The ingress's router: the router deployment's ``handle`` (``router.placement: own``), or
    a ``RouterDeployment`` built here over ``pool_handles`` (``ingress``: no router deployment)."""
    if config.router.placement == "ingress":
        return LocalRouterClient(RouterDeployment(config, pool_handles))
    return RouterClient(handle, by_value)


class RouterClient:
    def __init__(self, handle: Any, by_value: bool = False):
        """``handle``: the router deployment's ``DeploymentHandle`` (bound by the builder).
        ``by_value``: ``choose`` and ``release`` (one each per request) go over Serve's gRPC path
        (``ingress.handle_transport: grpc``); broadcasts stay on ``handle``, as Serve's
        ``broadcast`` calls every replica's actor."""
        self._handle = handle
        # the handle choose / release go through (None: tests that never call the router)
        self._calls = handle.options(_by_reference=False) if by_value and handle is not None else handle
        self._control_tasks: set[asyncio.Task[None]] = set()  # broadcasts in flight

    async def choose(self, route: RouteRequest, timeout_s: float) -> RouteDecision:
        """``RouterDeployment.choose``; raises ``asyncio.TimeoutError`` past ``timeout_s``, and
        whatever the call raised (``RoutingError`` for a request no pool may serve)."""
        decision: RouteDecision = await asyncio.wait_for(self._calls.choose.remote(route), timeout_s)
        return decision

    def release(self, decision: RouteDecision, ticket: str) -> None:
        """``RouterDeployment.release`` on the router replica that issued ``ticket`` (not awaited:
        a router that is down expires its tickets)."""
        try:
            self._calls.release.remote(ticket, replica_hint=decision.router_replica_id)
        except Exception:
            logger.debug("release of %s failed", ticket, exc_info=True)

    def forget(self, request_id: str) -> None:
        """``RouterDeployment.forget`` on every router replica (which one decided is unknown)."""
        self._broadcast(RouterDeployment.forget, request_id)

    def report_dead(self, replica_id: str | None, actor_id: str | None) -> None:
        """``RouterDeployment.report_dead`` on every router replica."""
        self._broadcast(RouterDeployment.report_dead, replica_id, actor_id)

    async def set_lora_adapter(self, name: str, path: str | None) -> None:
        """``RouterDeployment.set_lora_adapter`` on every router replica, awaited (up to
        ``CONTROL_TIMEOUT_S``): a runtime load or unload is answered once the routers hold it."""
        response = self._handle.broadcast(RouterDeployment.set_lora_adapter.__name__, name, path)
        await asyncio.wait_for(response.results_async(return_exceptions=True), CONTROL_TIMEOUT_S)

    async def lora_adapters(self, timeout_s: float) -> dict[str, str | None]:
        """``RouterDeployment.lora_adapters`` of one router replica."""
        answer: dict[str, str | None] = await asyncio.wait_for(self._handle.lora_adapters.remote(), timeout_s)
        return answer

    async def metrics_snapshots(self, timeout_s: float) -> list[MetricsSnapshot | BaseException]:
        """``RouterDeployment.metrics_snapshot()`` of every router replica (``GET /metrics``)."""
        return await broadcast_snapshots(self._handle, RouterDeployment.metrics_snapshot.__name__, timeout_s)

    async def check_health(self) -> None:
        """Nothing of the router is the ingress's to check: Serve probes the router deployment."""

    def _broadcast(self, method: Callable[..., Any], *args: Any) -> None:
        """Call ``method`` on every router replica without waiting for it."""
        name = method.__name__

        async def send() -> None:
            try:
                response = self._handle.broadcast(name, *args)
                await asyncio.wait_for(response.results_async(return_exceptions=True), CONTROL_TIMEOUT_S)
            except Exception as exc:  # a router down or gone: nothing of ours is counted there
                logger.debug("router broadcast %s failed: %r", name, exc)

        task = asyncio.get_running_loop().create_task(send())
        self._control_tasks.add(task)
        task.add_done_callback(self._control_tasks.discard)
