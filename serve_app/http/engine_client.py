"""The ingress's path to the engines: ask the router where, then stream from that replica
directly (tokens never pass through the router).

If the router does not answer within ``decision_timeout_s`` (or fails), the client chooses
locally: the eligible pool with the fewest requests this ingress has in flight, and no replica
hint, so the pool handle's request router picks the least-loaded replica. Each such fallback
is counted (``meshserve_router_fallbacks``).

With several router replicas: ``choose`` goes to the router replica that owns the request's
affinity key (the router handle's ``RendezvousRequestRouter``), ``release`` to the one that issued the
ticket (``replica_hint``), and ``forget`` / ``report_dead`` to all of them (broadcast, fire and
forget: control messages that must not delay the request).

No router round trip when it has nothing to choose: a request whose only eligible pool has one
running replica (as Serve last told this process's pool handle; a pool whose engine runs in this
process, ``placement: ingress``, always has one) and whose model has no prefill pool (no PD plan
to make) goes straight to that replica (reason ``single_replica``, no ticket). That is asked once
per API request, before its prompt is hashed (``placement``: a ``Placement`` the pipeline carries
to ``stream_choices``). Until the pool handle has heard from Serve, and for a retry, the router
decides as usual.

A call to an engine replica that fails because the replica's actor died (``RayActorError``:
died or unavailable; Serve's ``ReplicaUnavailableError``) is reported to the routers at once
(they drop the replica before their next poll). If the consumer has seen nothing of that
request yet it is decided again without the dead replica and retried once (also under PD). If
tokens were already passed on, the stream fails over (``ingress.max_failovers`` times, default 1):
prompt + the tokens sent go to the replica the router picks without the dead one, and the
continuation's deltas are rewritten so the client sees one seamless stream
(``serve_app/http/failover.py``). Other errors end the request with an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from accel.block_hash import hash_prompt_blocks, salted_root
from accel.contract import EmbeddingResult, EmbedRequest, GenerateRequest, OutputDelta
from deployments.config.app import AppConfig
from deployments.messages.routing import PoolNeeds, RouteDecision, RouteRequest, RoutingError, eligible_pools
from deployments.pd.orchestrator import Call, PDOrchestrator
from deployments.replicas.client import EnginePoolClient, PoolClient
from deployments.router.client import RouterCalls, router_calls
from serve_app.http.engine_errors import ReplicaDied, as_api_error, dead_replica_actor, died_error
from serve_app.http.failover import FAILOVER_REQUEST_ID_SUFFIX, StreamProgress
from serve_app.http.protocol.errors import APIError

logger = logging.getLogger(__name__)


RETRY_REQUEST_ID_SUFFIX = "#retry"


@dataclass(frozen=True)
class Placement:
    """Who places one API request's engine requests (``EngineClient.placement``, asked once per
    request, before its prompt is hashed). ``direct``: the decision for its pool's only replica,
    where every choice goes straight (reason ``single_replica``, no ticket, no router round trip,
    so no prefix hashes); None: the router places each choice, by prefix hashes, session and
    load. A retry or failover never reuses ``direct``: it asks the router without the dead replica."""

    direct: RouteDecision | None = None

    @property
    def by_router(self) -> bool:
        return self.direct is None


BY_ROUTER = Placement()


class EngineClient:
    def __init__(
        self,
        config: AppConfig,
        router_handle: Any,
        pool_handles: Mapping[str, Any],
        metrics: Any = None,
        tokenizers: Mapping[str, Tokenizer] | None = None,
        local_pools: Mapping[str, PoolClient] | None = None,
    ):
        """``tokenizers``: each model's (a failover's continuation text is made with it).
        ``local_pools``: the pools whose engine runs in this process (``placement: ingress``)."""
        self._pools = config.pools
        by_value = config.ingress.handle_transport == "grpc"
        self._router = router_calls(config, router_handle, pool_handles, by_value)
        self._engines: dict[str, PoolClient] = {n: EnginePoolClient(h, by_value) for n, h in pool_handles.items()}
        self._engines.update(local_pools or {})
        for engine in self._engines.values():
            engine.watch()  # hear of the pools' running replicas from now on (/health, /v1/models)
        self._models_with_prefill = {p.model for p in self._pools if p.role == "prefill"}
        self._timeout_s = config.router.decision_timeout_s
        self._retry_after_s = config.ingress.retry_after_s
        self._max_failovers = config.ingress.max_failovers
        self._tokenizers = dict(tokenizers or {})
        self._block_sizes = {m.name: m.routing_block_size for m in config.models}
        self._metrics = metrics
        self._local_inflight = {p.name: 0 for p in self._pools}
        self._pd = PDOrchestrator()

    @property
    def engines(self) -> Mapping[str, PoolClient]:
        return self._engines

    @property
    def router(self) -> RouterCalls:
        return self._router

    def check_routable(self, route: RouteRequest) -> None:
        """400 for a pinned pool that does not exist or serves another model (no RPC)."""
        try:
            eligible_pools(route, self._pools)
        except RoutingError as err:
            raise APIError(err.status, err.message, err.param) from None

    def release(self, decision: RouteDecision) -> None:
        """Hand ``decision``'s ticket back to the router (a request that ran outside ``stream``)."""
        if decision.ticket:
            self._router.release(decision, decision.ticket)

    def placement(self, needs: PoolNeeds) -> Placement:
        """Who places an API request that needs ``needs``, asked once per request before its prompt
        is hashed: straight to the only replica when its only eligible pool has one running
        replica (as Serve last told this process's pool handle) and its model has no prefill pool
        (no PD plan to make); else the router (also until the handle has heard from Serve, and for
        a pin the request will get its 400 for)."""
        if needs.model in self._models_with_prefill:
            return BY_ROUTER
        try:
            pools = eligible_pools(needs, self._pools)
        except RoutingError:
            return BY_ROUTER
        if len(pools) != 1:
            return BY_ROUTER
        engine = self._engines.get(pools[0].name)
        running = engine.running_replicas() if engine is not None else None
        if running is None or len(running) != 1:
            return BY_ROUTER
        return Placement(
            RouteDecision(pool=pools[0].name, replica_id=next(iter(running)), ticket="", reason="single_replica")
        )

    async def decide(self, route: RouteRequest) -> RouteDecision:
        """The router's decision for ``route``, or the local fallback's when it does not answer."""
        try:
            return await self._router.choose(route, self._timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            reason = "timeout" if isinstance(exc, asyncio.TimeoutError) else type(exc).__name__
            logger.warning("router unavailable (%s); choosing locally", reason)
            if self._metrics is not None:
                self._metrics.fallback(reason)
            # A decision that arrives after the timeout was counted by the router: release it.
            self._router.forget(route.request_id)
            pools = eligible_pools(route, self._pools)
            pool = min(pools, key=lambda p: self._local_inflight[p.name])
            return RouteDecision(pool=pool.name, replica_id=None, ticket="", reason=f"fallback:{reason}")

    def _report_dead(self, decision: RouteDecision, actor_id: str | None) -> None:
        """Tell every router replica. Under PD the failed call may have been the prefill one, so
        only the actor id (exact) names the replica there."""
        replica_id = decision.replica_id if not decision.is_disaggregated else None
        logger.warning(
            "engine replica %s (actor %s) of pool %s died; telling the routers", replica_id, actor_id, decision.pool
        )
        if replica_id is not None or actor_id is not None:
            self._router.report_dead(replica_id, actor_id)

    def stream_choices(
        self,
        requests: Sequence[GenerateRequest],
        routes: Sequence[RouteRequest],
        placement: Placement = BY_ROUTER,
    ) -> list[AsyncGenerator[OutputDelta, None]]:
        """The engine requests of one API request (n > 1, several prompts), placed as ``placement``
        says. When the client pinned no pool and several could serve them, the first is placed as
        usual and the others in the pool it went to: every choice runs on one engine kind (seeded
        sampling, logprobs and speed are the engine's), as one vLLM server would run them. Not for
        a model with a prefill pool, where the router plans each choice's prefill/decode pair."""
        free = (
            len(requests) > 1
            and routes[0].pool is None
            and routes[0].model not in self._models_with_prefill
            and len(eligible_pools(routes[0], self._pools)) > 1
        )
        if not free:
            return [self.stream(r, route, placement=placement) for r, route in zip(requests, routes)]
        placed: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def sibling(request: GenerateRequest, route: RouteRequest) -> AsyncGenerator[OutputDelta, None]:
            pool = await placed
            async with contextlib.aclosing(self.stream(request, dataclasses.replace(route, pool=pool))) as deltas:
                async for delta in deltas:
                    yield delta

        first = self.stream(requests[0], routes[0], placed)
        return [first, *(sibling(r, route) for r, route in zip(requests[1:], routes[1:]))]

    async def stream(
        self,
        request: GenerateRequest,
        route: RouteRequest,
        placed: asyncio.Future[str] | None = None,
        placement: Placement = BY_ROUTER,
    ) -> AsyncGenerator[OutputDelta, None]:
        """Deltas of one engine request. Closing or cancelling this generator early cancels the
        replica call, which aborts the engine request there. ``placed``: given the pool the
        router chose (``stream_choices``); cancelled if no decision was made.

        A replica death before any token: decided again without it and retried once. After
        tokens were passed on: up to ``ingress.max_failovers`` times, the stream continues on
        another replica from prompt + the tokens sent (``failover.StreamProgress``)."""
        decision = await self._first_decision(route, placed, placement)
        progress = StreamProgress(request, self._tokenizers.get(route.model))
        attempt, tries = request, _Tries()
        while True:
            try:
                # aclosing: a consumer that leaves early closes the attempt at once (cancel + release).
                async with contextlib.aclosing(self._stream_once(attempt, decision)) as deltas:
                    async for delta in deltas:
                        yield progress.pass_on(delta)
                        if progress.finished:  # the engine's finish, or a stop string seen across a failover
                            break
                return
            except ReplicaDied as died:
                self._report_dead(decision, died.actor_id)
                following = self._next_attempt(died, request, route.model, progress, tries)
            if following is None:  # the replica died after the last token
                yield progress.length_end()
                return
            attempt, suffix = following
            route = self._rerouted(route, decision, request, attempt, suffix)
            decision = await self.decide(route)

    async def _first_decision(
        self, route: RouteRequest, placed: asyncio.Future[str] | None, placement: Placement
    ) -> RouteDecision:
        """``placement``'s direct decision, else the router's; tells ``placed`` the pool (or
        cancels it when no decision was made)."""
        try:
            decision = placement.direct or await self.decide(route)
        except BaseException:
            if placed is not None:
                placed.cancel()
            raise
        if placed is not None and not placed.done():
            placed.set_result(decision.pool)
        return decision

    def _next_attempt(
        self, died: ReplicaDied, request: GenerateRequest, model: str, progress: StreamProgress, tries: _Tries
    ) -> tuple[GenerateRequest, str] | None:
        """After the replica died: (what to run next, its request-id suffix); None when it died
        after the last token. Raises the 503 once the retry or the failovers are spent."""
        if not progress.started:
            if tries.retried:
                raise died_error(self._retry_after_s) from died.error
            tries.retried = True
            logger.warning("retrying %s after %s", request.request_id, type(died.error).__name__)
            return request, RETRY_REQUEST_ID_SUFFIX
        if tries.failovers >= self._max_failovers:
            raise died_error(self._retry_after_s) from died.error
        tries.failovers += 1
        continuation = progress.continuation(tries.failovers)
        if continuation is None:
            return None
        logger.warning(
            "replica of %s died after %d tokens; continuing on another replica (failover %d of %d)",
            request.request_id,
            len(progress.token_ids),
            tries.failovers,
            self._max_failovers,
        )
        if self._metrics is not None:
            self._metrics.failover(model)
        return continuation, f"{FAILOVER_REQUEST_ID_SUFFIX}{tries.failovers}"

    def _rerouted(
        self,
        route: RouteRequest,
        decision: RouteDecision,
        request: GenerateRequest,
        attempt: GenerateRequest,
        suffix: str,
    ) -> RouteRequest:
        """``route`` for the next attempt: without the dead replica and under a new route id (so the
        first decision's release cannot end the second); a continuation is routed by its own
        (longer) prompt, hashed from the request's salted root as the ingress hashes every prompt;
        one with images keeps the first attempt's hashes (keyed by its images where the ingress
        found them: a prefix of the continuation's own chain)."""
        excluded = route.excluded_replicas + ((decision.replica_id,) if decision.replica_id else ())
        ids = attempt.prompt_token_ids
        hashes = route.prompt_block_hashes
        if attempt is not request and not request.images:
            root = salted_root(request.cache_salt, route.lora)
            hashes = tuple(hash_prompt_blocks(ids, self._block_sizes[route.model], root))
        return dataclasses.replace(
            route,
            request_id=route.request_id + suffix,
            num_prompt_tokens=len(ids),
            prompt_block_hashes=hashes,
            excluded_replicas=excluded,
        )

    async def embed(self, request: EmbedRequest, route: RouteRequest) -> EmbeddingResult:
        """One pooling request (``route.task == "embed"``) on the replica the router picks; the
        ticket is released however it ends. A replica that dies answers 503 (no retry: nothing
        was streamed, the client retries the whole request)."""
        decision = self.placement(route.needs).direct or await self.decide(route)
        self._local_inflight[decision.pool] += 1
        try:
            return await self._engines[decision.pool].embed(request, decision.replica_id)
        except (APIError, asyncio.CancelledError):
            raise
        except Exception as exc:
            is_dead, actor_id = dead_replica_actor(exc)
            if is_dead:
                self._report_dead(decision, actor_id)
                raise died_error(self._retry_after_s) from exc
            raise as_api_error(exc, self._retry_after_s) from exc
        finally:
            self._local_inflight[decision.pool] -= 1
            self.release(decision)

    async def _stream_once(
        self, request: GenerateRequest, decision: RouteDecision
    ) -> AsyncGenerator[OutputDelta, None]:
        """One attempt on ``decision``; a dead replica raises ``ReplicaDied``, other failures
        their ``APIError``. Releases the decision's ticket however it ends."""
        self._local_inflight[decision.pool] += 1
        stream: AsyncGenerator[OutputDelta, None]
        if decision.is_disaggregated:  # prefill/decode disaggregation
            stream = self._pd.stream(request, self._prefill_call(decision), self._decode_call(decision))
        else:
            stream = self._replica_stream(decision.pool, decision.replica_id, request)
        try:
            async with contextlib.aclosing(stream) as deltas:  # closing cancels the replica call
                async for delta in deltas:
                    yield delta
        except (APIError, asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:
            is_dead, actor_id = dead_replica_actor(exc)
            if is_dead:
                raise ReplicaDied(exc, actor_id) from exc
            raise as_api_error(exc, self._retry_after_s) from exc
        finally:
            self._local_inflight[decision.pool] -= 1
            if decision.ticket:
                self._router.release(decision, decision.ticket)

    # -- prefill/decode disaggregation (deployments/pd/orchestrator.py) ---------------------------

    def _prefill_call(self, decision: RouteDecision) -> Call:
        pool = decision.prefill_pool
        assert pool is not None  # a disaggregated decision

        async def call(request: GenerateRequest) -> AsyncGenerator[OutputDelta, None]:
            try:
                async for delta in self._replica_stream(pool, decision.prefill_replica_id, request):
                    yield delta
            finally:
                if decision.prefill_ticket:
                    self._router.release(decision, decision.prefill_ticket)

        return call

    def _decode_call(self, decision: RouteDecision) -> Call:
        return lambda request: self._replica_stream(decision.pool, decision.replica_id, request)

    async def _replica_stream(
        self, pool: str, replica_id: str | None, request: GenerateRequest
    ) -> AsyncGenerator[OutputDelta, None]:
        gen = self._engines[pool].generate(request, replica_id)
        finished = False
        try:
            async for delta in gen:
                finished = delta.finished
                yield delta
        finally:
            if not finished:
                gen.cancel()


@dataclass
class _Tries:
    """What one engine request has spent of its recovery: the retry before any token, and the
    failovers after."""

    retried: bool = False
    failovers: int = 0
