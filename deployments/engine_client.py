"""The ingress's path to the engines: ask the router where, then stream from that replica
directly (tokens never pass through the router).

If the router does not answer within ``decision_timeout_s`` (or fails), the client chooses
locally: the eligible pool with the fewest requests this ingress has in flight, and no replica
hint, so the pool handle's request router picks the least-loaded replica. Each such fallback
is counted (``meshserve_router_fallbacks``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from accel.contract import GenerateRequest, InvalidRequestError, OutputDelta
from deployments.pd_orchestrator import PDOrchestrator
from deployments.route_types import PoolInfo, RouteDecision, RouteRequest, RoutingError, eligible_pools
from serve_app.protocol.errors import APIError

logger = logging.getLogger(__name__)

_DONE = object()


class EngineClient:
    def __init__(self, pools: Sequence[PoolInfo], router_handle: Any, pool_handles: Mapping[str, Any],
                 decision_timeout_s: float, retry_after_s: int, metrics: Any = None):
        self._pools = tuple(pools)
        self._router = router_handle
        self._streams = {name: h.options(stream=True) for name, h in pool_handles.items()}
        self._timeout_s = decision_timeout_s
        self._retry_after_s = retry_after_s
        self._metrics = metrics
        self._local_inflight = {p.name: 0 for p in self._pools}
        self._pd = PDOrchestrator()

    def check_routable(self, route: RouteRequest) -> None:
        """400 for a pinned pool that does not exist or serves another model (no RPC)."""
        try:
            eligible_pools(route, self._pools)
        except RoutingError as err:
            raise APIError(400, err.message, err.param) from None

    async def decide(self, route: RouteRequest) -> RouteDecision:
        try:
            return await asyncio.wait_for(self._router.choose.remote(route), self._timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            reason = "timeout" if isinstance(exc, asyncio.TimeoutError) else type(exc).__name__
            logger.warning("router unavailable (%s); choosing locally", reason)
            if self._metrics is not None:
                self._metrics.fallback(reason)
            self._forget_late_decision(route.request_id)
            pools = eligible_pools(route, self._pools)
            pool = min(pools, key=lambda p: self._local_inflight[p.name])
            return RouteDecision(pool=pool.name, replica_id=None, ticket="", reason=f"fallback:{reason}")

    def _forget_late_decision(self, request_id: str) -> None:
        """A decision that arrives after the timeout was counted by the router: release it."""
        try:
            self._router.forget.remote(request_id)
        except Exception:  # the router is down: nothing is counted there either
            pass

    async def stream(self, request: GenerateRequest, route: RouteRequest) -> AsyncIterator[OutputDelta]:
        """Deltas of one engine request. Closing or cancelling this generator early cancels the
        replica call, which aborts the engine request there."""
        decision = await self.decide(route)
        self._local_inflight[decision.pool] += 1
        gen = None
        finished = False
        try:
            if decision.prefill_pool is not None:  # prefill/decode disaggregation
                async for delta in self._pd.stream(request, self._prefill_call(decision), self._decode_call(decision)):
                    finished = delta.finished
                    yield delta
                return
            gen = self._streams[decision.pool].generate.remote(request, replica_hint=decision.replica_id)
            async for delta in gen:
                finished = delta.finished
                yield delta
        except (APIError, asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:
            raise _as_api_error(exc, self._retry_after_s) from exc
        finally:
            self._local_inflight[decision.pool] -= 1
            if gen is not None and not finished:
                gen.cancel()
            if decision.ticket:
                self._router.release.remote(decision.ticket)


    # -- prefill/decode disaggregation (deployments/pd_orchestrator.py) ---------------------------

    def _prefill_call(self, decision: RouteDecision):
        async def call(request: GenerateRequest) -> AsyncIterator[OutputDelta]:
            try:
                async for delta in self._replica_stream(decision.prefill_pool, decision.prefill_replica_id, request):
                    yield delta
            finally:
                if decision.prefill_ticket:
                    self._router.release.remote(decision.prefill_ticket)
        return call

    def _decode_call(self, decision: RouteDecision):
        return lambda request: self._replica_stream(decision.pool, decision.replica_id, request)

    async def _replica_stream(self, pool: str, replica_id: str | None,
                              request: GenerateRequest) -> AsyncIterator[OutputDelta]:
        gen = self._streams[pool].generate.remote(request, replica_hint=replica_id)
        finished = False
        try:
            async for delta in gen:
                finished = delta.finished
                yield delta
        finally:
            if not finished:
                gen.cancel()


def _as_api_error(exc: Exception, retry_after_s: int) -> APIError:
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

    cause = getattr(exc, "cause", None) or exc
    if isinstance(exc, InvalidRequestError) or isinstance(cause, InvalidRequestError):
        err = cause if isinstance(cause, InvalidRequestError) else exc
        return APIError(400, err.message, err.field)
    if isinstance(exc, BackPressureError):
        status = int(getattr(exc, "args", (0, 0, 503))[2] or 503)
        return APIError(status, "The engines are at capacity; retry later.", None, retry_after_s)
    if isinstance(exc, DeploymentUnavailableError):
        return APIError(503, "No engine replica is available; retry later.", None, retry_after_s)
    logger.exception("engine request failed")
    return APIError(500, f"engine error: {type(cause).__name__}: {cause}")


async def merge_streams(streams: Sequence[AsyncIterator[OutputDelta]]
                        ) -> AsyncIterator[tuple[int, OutputDelta]]:
    """Interleave several delta streams as they produce; (stream index, delta). An error in any
    stream ends the merge with that error; leaving early cancels every stream."""
    if len(streams) == 1:
        async for delta in streams[0]:
            yield 0, delta
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, s: AsyncIterator[OutputDelta]) -> None:
        try:
            async for d in s:
                queue.put_nowait((i, d))
        except Exception as exc:
            queue.put_nowait((i, exc))
        finally:
            queue.put_nowait((i, _DONE))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is _DONE:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
