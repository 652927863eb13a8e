"""The ingress's engine client: router decision (or local fallback), direct streaming with a
replica hint, cancel + release when the consumer leaves early, error mapping, stream merging."""

from __future__ import annotations

import asyncio

import pytest

from accel.contract import FinishReason, GenerateRequest, InvalidRequestError, OutputDelta
from deployments.ingress.engine_client import EngineClient, merge_streams
from deployments.router.messages import RouteDecision, RouteRequest
from serve_app.config.ingress import IngressConfig
from serve_app.config.router import RouterConfig
from serve_app.protocol.errors import APIError
from tests.doubles.app_configs import app_config, pool_config

POOLS = (pool_config("tt", "m", "tt", "cpu", "both"), pool_config("vllm", "m", "vllm", "cpu", "both"))


def _delta(rid, n, done=False):
    return OutputDelta(rid, (n,), str(n), 2, n, finish_reason=FinishReason.LENGTH if done else None)


class FakeResponse:
    def __init__(self, value=None, delay_s=0.0, error=None):
        self._value, self._delay_s, self._error = value, delay_s, error

    def __await__(self):
        async def get():
            await asyncio.sleep(self._delay_s)
            if self._error:
                raise self._error
            return self._value

        return get().__await__()


class FakeMethod:
    def __init__(self, fn):
        self.remote = fn


class FakeBroadcast:
    def __init__(self, record):
        self._record = record

    async def results_async(self, return_exceptions=False):
        self._record()
        return [None]


class FakeRouterHandle:
    """``choose`` answers ``decision`` (or a list of them, one per call); ``release`` records the
    ticket and its router-replica hint; broadcasts (``forget``, ``report_dead``) are recorded."""

    def __init__(self, decision=None, delay_s=0.0, error=None):
        self.released, self.hints, self.routes = [], [], []
        decisions = decision if isinstance(decision, list) else None

        def choose(route):
            self.routes.append(route)
            return FakeResponse(decisions.pop(0) if decisions else decision, delay_s, error)

        def release(ticket, replica_hint=None):
            self.released.append(ticket)
            self.hints.append(replica_hint)

        self.choose = FakeMethod(choose)
        self.release = FakeMethod(release)
        self.forgotten, self.dead_reports = [], []

    def broadcast(self, method, *args):
        target = {"forget": self.forgotten, "report_dead": self.dead_reports}[method]
        return FakeBroadcast(lambda: target.append(args[0] if method == "forget" else args))


class FakeStream:
    def __init__(self, deltas, error=None):
        self._deltas, self._error, self.cancelled = list(deltas), error, False

    def __aiter__(self):
        return self

    async def __anext__(self):
        await asyncio.sleep(0)
        if self._deltas:
            return self._deltas.pop(0)
        if self._error:
            raise self._error
        raise StopAsyncIteration

    def cancel(self):
        self.cancelled = True


class FakePoolHandle:
    def __init__(self, make_stream):
        self.calls = []
        self._make = make_stream
        self.generate = FakeMethod(self._call)

    def options(self, stream, **serialization):
        self.options_seen = dict(serialization, stream=stream)
        return self

    def _call(self, request, replica_hint=None):
        self.calls.append((request.request_id, replica_hint))
        self.last = self._make(request)
        return self.last


def _client(router, pools=None, metrics=None):
    pools = pools or {
        "tt": FakePoolHandle(lambda r: FakeStream([_delta(r.request_id, 1), _delta(r.request_id, 2, True)])),
        "vllm": FakePoolHandle(lambda r: FakeStream([_delta(r.request_id, 1, True)])),
    }
    config = app_config(POOLS, RouterConfig(decision_timeout_s=0.05), ingress=IngressConfig(retry_after_s=2))
    return EngineClient(config, router, pools, metrics=metrics), pools


REQ = GenerateRequest("r", (1, 2))


def test_routes_to_the_chosen_replica_and_releases():
    async def run():
        router = FakeRouterHandle(RouteDecision("vllm", "v1", "t7", "least_loaded", router_replica_id="R2"))
        client, pools = _client(router)
        deltas = [d async for d in client.stream(REQ, RouteRequest("r", "m", 2))]
        assert len(deltas) == 1 and pools["vllm"].calls == [("r", "v1")]
        assert router.released == ["t7"] and not pools["vllm"].last.cancelled
        assert router.hints == ["R2"]  # released on the router replica that issued the ticket
        # The token stream is read with plain pickle (cloudpickle costs ~10x per delta).
        assert pools["vllm"].options_seen == {
            "stream": True,
            "request_serialization": "pickle",
            "response_serialization": "pickle",
        }

    asyncio.run(run())


class Counter:
    def __init__(self):
        self.reasons = []

    def fallback(self, reason):
        self.reasons.append(reason)


@pytest.mark.parametrize("router", [FakeRouterHandle(delay_s=1.0), FakeRouterHandle(error=RuntimeError("down"))])
def test_unreachable_router_falls_back_locally_and_counts(router):
    async def run():
        metrics = Counter()
        client, pools = _client(router, metrics=metrics)
        deltas = [d async for d in client.stream(REQ, RouteRequest("r", "m", 2, pool="tt"))]
        await asyncio.sleep(0.01)  # (the forget broadcast is fire-and-forget)
        assert deltas[-1].finished and pools["tt"].calls == [("r", None)]
        assert metrics.reasons in (["timeout"], ["RuntimeError"])
        assert router.released == [] and router.forgotten == ["r"]  # a late decision is not left counted

    asyncio.run(run())


def test_leaving_early_cancels_the_replica_call():
    async def run():
        router = FakeRouterHandle(RouteDecision("tt", "t1", "t1x", "least_loaded"))
        client, pools = _client(router)
        gen = client.stream(REQ, RouteRequest("r", "m", 2))
        await gen.__anext__()
        await gen.aclose()
        assert pools["tt"].last.cancelled and router.released == ["t1x"]

    asyncio.run(run())


def test_engine_errors_become_api_errors():
    async def run():
        router = FakeRouterHandle(RouteDecision("tt", None, "", "x"))
        bad = {"tt": FakePoolHandle(lambda r: FakeStream([], InvalidRequestError("logprobs", "too many")))}
        client, _ = _client(router, pools=bad)
        with pytest.raises(APIError) as err:
            [d async for d in client.stream(REQ, RouteRequest("r", "m", 2, pool="tt"))]
        assert (err.value.status, err.value.param) == (400, "logprobs")

        from ray.serve.exceptions import BackPressureError

        full = {"tt": FakePoolHandle(lambda r: FakeStream([], BackPressureError(5, 5, 503)))}
        client, _ = _client(router, pools=full)
        with pytest.raises(APIError) as err:
            [d async for d in client.stream(REQ, RouteRequest("r", "m", 2, pool="tt"))]
        assert err.value.status == 503 and err.value.headers() == {"Retry-After": "2"}

    asyncio.run(run())


def test_bad_pin_is_a_400_without_rpc():
    client, _ = _client(FakeRouterHandle())
    with pytest.raises(APIError) as err:
        client.check_routable(RouteRequest("r", "m", 2, pool="gpu"))
    assert err.value.param == "x-meshserve-pool"


def test_merge_interleaves_and_cancels_on_exit():
    async def gen(tag, n, delay):
        try:
            for i in range(n):
                await asyncio.sleep(delay)
                yield _delta(tag, i)
        finally:
            closed.append(tag)

    closed = []

    async def run():
        got = [(i, d.request_id) async for i, d in merge_streams([gen("a", 3, 0.001), gen("b", 2, 0.0015)])]
        assert sorted(got) == [(0, "a")] * 3 + [(1, "b")] * 2
        merged = merge_streams([gen("c", 100, 0.001), gen("d", 100, 0.001)])
        await merged.__anext__()
        await merged.aclose()
        assert {"c", "d"} <= set(closed)

    asyncio.run(run())


class DyingStream(FakeStream):
    """Yields ``deltas`` then fails the way a call to a dead replica actor fails."""

    def __init__(self, deltas, error):
        super().__init__(deltas, error)


def _dead_actor_error():
    from ray.exceptions import ActorUnavailableError

    return ActorUnavailableError("Actor is unavailable.", bytes.fromhex("ab" * 16))


def test_dead_replica_before_any_output_is_reported_and_retried_elsewhere():
    async def run():
        router = FakeRouterHandle(
            [
                RouteDecision("tt", "t1", "r", "prefix", router_replica_id="R1"),
                RouteDecision("tt", "t2", "r#retry", "load", router_replica_id="R1"),
            ]
        )
        calls = []

        def make(request):
            calls.append(request.request_id)
            if len(calls) == 1:
                return FakeStream([], _dead_actor_error())
            return FakeStream([_delta(request.request_id, 1), _delta(request.request_id, 2, True)])

        client, pools = _client(router, pools={"tt": FakePoolHandle(make)})
        route = RouteRequest("r", "m", 2, session_id="chat")
        deltas = [d async for d in client.stream(REQ, route)]
        await asyncio.sleep(0.01)
        assert [d.new_token_ids for d in deltas] == [(1,), (2,)] and deltas[-1].finished
        assert pools["tt"].calls == [("r", "t1"), ("r", "t2")]  # the same engine request, elsewhere
        retry = router.routes[1]
        assert retry.excluded_replicas == ("t1",) and retry.request_id == "r#retry"
        assert retry.affinity_key == route.affinity_key  # decided by the same router replica
        assert router.dead_reports == [("t1", "ab" * 16)]
        assert router.released == ["r", "r#retry"]

    asyncio.run(run())


def test_dead_replica_after_output_began_fails_over_once_then_503():
    async def run():
        router = FakeRouterHandle(RouteDecision("tt", "t1", "r", "prefix", router_replica_id="R1"))
        pools = {"tt": FakePoolHandle(lambda r: FakeStream([_delta(r.request_id, 1)], _dead_actor_error()))}
        client, _ = _client(router, pools=pools)
        got = []
        with pytest.raises(APIError) as err:
            async for d in client.stream(REQ, RouteRequest("r", "m", 2)):
                got.append(d)
        await asyncio.sleep(0.01)
        # One failover (ingress.max_failovers = 1); its replica dies too: 503.
        assert len(got) == 2 and err.value.status == 503 and err.value.headers() == {"Retry-After": "2"}
        assert router.dead_reports == [("t1", "ab" * 16)] * 2 and len(router.routes) == 2
        assert router.routes[1].request_id == "r#failover1" and router.routes[1].excluded_replicas == ("t1",)
        assert router.released == ["r", "r"]

    asyncio.run(run())


def test_mid_stream_failover_continues_from_the_tokens_sent():
    """The continuation gets prompt + tokens sent and the rest of the budget; its deltas reach the
    consumer in the original request's terms (id, prompt length, cumulative completion count)."""
    from accel.contract import SamplingParams

    request = GenerateRequest("r", (1, 2, 3), SamplingParams(max_tokens=5, min_tokens=3, temperature=0))

    async def run():
        router = FakeRouterHandle([RouteDecision("tt", "t1", "a", "prefix"), RouteDecision("tt", "t2", "b", "load")])
        seen = []

        def make(req):
            seen.append(req)
            if len(seen) == 1:  # two tokens, then the replica dies
                return FakeStream(
                    [OutputDelta("r", (7,), "x", 3, 1, 2), OutputDelta("r", (8,), "y", 3, 2, 2)], _dead_actor_error()
                )
            rid = req.request_id
            return FakeStream(
                [
                    OutputDelta(rid, (9,), "z", 5, 1, 5),
                    OutputDelta(rid, (4, 6), "w", 5, 3, 5, finish_reason=FinishReason.LENGTH),
                ]
            )

        client, pools = _client(router, pools={"tt": FakePoolHandle(make)})
        deltas = [d async for d in client.stream(request, RouteRequest("r", "m", 3))]
        cont = seen[1]
        assert cont.request_id == "r#failover1" and cont.prompt_token_ids == (1, 2, 3, 7, 8)
        assert cont.sampling.max_tokens == 3 and cont.sampling.min_tokens == 1
        assert pools["tt"].calls == [("r", "t1"), ("r#failover1", "t2")]
        assert [t for d in deltas for t in d.new_token_ids] == [7, 8, 9, 4, 6]
        assert {d.request_id for d in deltas} == {"r"} and {d.num_prompt_tokens for d in deltas} == {3}
        assert [d.num_completion_tokens for d in deltas] == [1, 2, 3, 5]
        assert {d.num_cached_tokens for d in deltas} == {2} and deltas[-1].finish_reason == FinishReason.LENGTH
        assert router.routes[1].num_prompt_tokens == 5 and router.routes[1].excluded_replicas == ("t1",)

    asyncio.run(run())


def test_no_failover_when_disabled():
    async def run():
        router = FakeRouterHandle(RouteDecision("tt", "t1", "r", "prefix"))
        pools = {"tt": FakePoolHandle(lambda r: FakeStream([_delta(r.request_id, 1)], _dead_actor_error()))}
        config = app_config(POOLS, RouterConfig(decision_timeout_s=0.05), ingress=IngressConfig(max_failovers=0))
        client = EngineClient(config, router, pools)
        with pytest.raises(APIError) as err:
            [d async for d in client.stream(REQ, RouteRequest("r", "m", 2))]
        assert err.value.status == 503 and len(router.routes) == 1

    asyncio.run(run())


def test_a_dependency_dying_inside_a_live_replica_is_not_a_replica_death():
    from ray.exceptions import ActorDiedError, RayTaskError

    async def run():
        router = FakeRouterHandle(RouteDecision("tt", "t1", "r", "prefix"))
        wrapped = RayTaskError("generate", "traceback", ActorDiedError())
        client, _ = _client(router, pools={"tt": FakePoolHandle(lambda r: FakeStream([], wrapped))})
        with pytest.raises(APIError) as err:
            [d async for d in client.stream(REQ, RouteRequest("r", "m", 2))]
        await asyncio.sleep(0.01)
        assert err.value.status == 500 and router.dead_reports == [] and len(router.routes) == 1

    asyncio.run(run())


def _membership_pools(app):
    """Pool handles that name their deployment, as Serve's handles do."""
    pools = {
        "tt": FakePoolHandle(lambda r: FakeStream([_delta(r.request_id, 1, True)])),
        "vllm": FakePoolHandle(lambda r: FakeStream([_delta(r.request_id, 1), _delta(r.request_id, 2, True)])),
    }
    for name, handle in pools.items():
        handle.app_name, handle.deployment_name = app, f"Replica-{name}"
    return pools


def test_single_running_replica_is_used_without_a_router_round_trip():
    from deployments.router import replica_membership

    async def run():
        router = FakeRouterHandle(RouteDecision("vllm", "v1", "t1", "least_loaded"))
        client, pools = _client(router, _membership_pools("single-app"))
        route = RouteRequest("r", "m", 2, pool="vllm")
        # Before Serve told this process anything about the pool: the router decides.
        assert [d.finished for d in [d async for d in client.stream(REQ, route)]] == [False, True]
        assert len(router.routes) == 1 and router.released == ["t1"]
        replica_membership.publish("single-app", "Replica-vllm", frozenset({"only"}))
        deltas = [d async for d in client.stream(REQ, route)]
        assert [t for d in deltas for t in d.new_token_ids] == [1, 2] and deltas[-1].finished
        assert len(router.routes) == 1 and router.released == ["t1"]  # no choose, no ticket to release
        assert pools["vllm"].calls[-1] == ("r", "only")
        # Unpinned, the model has two eligible pools: the router decides between them.
        [d async for d in client.stream(REQ, RouteRequest("r", "m", 2))]
        assert len(router.routes) == 2
        # A second replica joined: the router decides again.
        replica_membership.publish("single-app", "Replica-vllm", frozenset({"only", "second"}))
        [d async for d in client.stream(REQ, route)]
        assert len(router.routes) == 3

    asyncio.run(run())


def test_no_shortcut_for_a_retry_or_a_model_with_a_prefill_pool():
    from deployments.router import replica_membership

    replica_membership.publish("pd-app", "Replica-vllm", frozenset({"only"}))
    pd_pools = (pool_config("vllm", engine="vllm", role="decode"), pool_config("tt", role="prefill"))
    client = EngineClient(app_config(pd_pools), FakeRouterHandle(), _membership_pools("pd-app"))
    assert client.single_replica_decision(RouteRequest("r", "m", 2, pool="vllm")) is None  # PD may apply
    client, _ = _client(FakeRouterHandle(), _membership_pools("pd-app"))
    assert client.single_replica_decision(RouteRequest("r", "m", 2, pool="vllm")).replica_id == "only"
    retry = RouteRequest("r#retry", "m", 2, pool="vllm", excluded_replicas=("gone",))
    assert client.single_replica_decision(retry) is None


def test_pd_decode_death_mid_stream_continues_on_another_decode_replica():
    from accel.contract import KVTransferParams, SamplingParams

    pd_pools = (pool_config("pre", "m", "vllm", "cpu", "prefill"), pool_config("dec", "m", "vllm", "cpu", "decode"))
    request = GenerateRequest("r", (1, 2, 3), SamplingParams(max_tokens=4, temperature=0))

    async def run():
        router = FakeRouterHandle(
            [
                RouteDecision("dec", "d1", "a", "prefill_decode", prefill_pool="pre", prefill_replica_id="p1"),
                RouteDecision("dec", "d2", "b", "load"),
            ]
        )
        decode_calls = []
        ticket = KVTransferParams(do_remote_prefill=True, transfer_id="x")

        def prefill(req):
            return FakeStream(
                [OutputDelta(req.request_id, (5,), "", 3, 1, kv_transfer=ticket, finish_reason=FinishReason.LENGTH)]
            )

        def decode(req):
            decode_calls.append(req)
            if len(decode_calls) == 1:  # the decode replica dies after two tokens
                return FakeStream(
                    [OutputDelta("r", (7,), "", 3, 1), OutputDelta("r", (8,), "", 3, 2)], _dead_actor_error()
                )
            return FakeStream([OutputDelta(req.request_id, (9, 4), "", 5, 2, finish_reason=FinishReason.LENGTH)])

        pools = {"pre": FakePoolHandle(prefill), "dec": FakePoolHandle(decode)}
        client = EngineClient(app_config(pd_pools, RouterConfig(decision_timeout_s=0.05)), router, pools)
        deltas = [d async for d in client.stream(request, RouteRequest("r", "m", 3))]
        assert [t for d in deltas for t in d.new_token_ids] == [7, 8, 9, 4] and deltas[-1].finished
        assert decode_calls[0].kv_transfer == ticket  # the first decode imported the prefill's KV
        assert decode_calls[1].prompt_token_ids == (1, 2, 3, 7, 8) and decode_calls[1].kv_transfer is None
        assert router.routes[1].excluded_replicas == ("d1",)
        assert deltas[-1].num_prompt_tokens == 3 and deltas[-1].num_completion_tokens == 4

    asyncio.run(run())
