"""The ingress's engine client: router decision (or local fallback), direct streaming with a
replica hint, cancel + release when the consumer leaves early, error mapping, the single-replica
shortcut (``placement``). Replica deaths (retry, failover): test_engine_client_failover.py."""

from __future__ import annotations

import asyncio

import pytest

from accel.contract import InvalidRequestError
from deployments.config.ingress import IngressConfig
from deployments.config.router import RouterConfig
from deployments.messages.routing import PoolNeeds, RouteDecision, RouteRequest
from serve_app.http.engine_client import EngineClient
from serve_app.http.protocol.errors import APIError
from serve_app.http.stream_merge import merge_streams
from tests.doubles.app_configs import app_config, pool_config
from tests.serve_app.http.engine_doubles import (
    POOLS,
    REQ,
    FakePoolHandle,
    FakeRouterHandle,
    FakeStream,
    dead_actor_error,
    delta,
    make_client,
)


def test_routes_to_the_chosen_replica_and_releases():
    async def run():
        router = FakeRouterHandle(RouteDecision("vllm", "v1", "t7", "least_loaded", router_replica_id="R2"))
        client, pools = make_client(router)
        deltas = [d async for d in client.stream(REQ, RouteRequest("r", "m", 2))]
        assert len(deltas) == 1 and pools["vllm"].calls == [("r", "v1")]
        assert router.released == ["t7"] and not pools["vllm"].last.cancelled
        assert router.hints == ["R2"]  # released on the router replica that issued the ticket
        # The token stream is read with plain pickle (cloudpickle costs ~10x per delta), by value
        # (ingress.handle_transport grpc, the default): Serve's gRPC path, not object refs.
        assert pools["vllm"].options_seen == {
            "stream": True,
            "request_serialization": "pickle",
            "response_serialization": "pickle",
            "_by_reference": False,
        }
        assert router.options_seen == {"_by_reference": False}  # choose / release by value too

    asyncio.run(run())


class Counter:
    def __init__(self):
        self.reasons = []

    def fallback(self, reason):
        self.reasons.append(reason)


def test_actor_transport_streams_by_reference():
    async def run():
        router = FakeRouterHandle(RouteDecision("vllm", "v1", "t7", "least_loaded"))
        pools = {"vllm": FakePoolHandle(lambda r: FakeStream([delta(r.request_id, 1, True)]))}
        ingress = IngressConfig(handle_transport="actor")
        client = EngineClient(app_config(POOLS[1:], RouterConfig(), ingress=ingress), router, pools)
        assert len([d async for d in client.stream(REQ, RouteRequest("r", "m", 2))]) == 1
        assert pools["vllm"].options_seen["_by_reference"] is True
        assert router.options_seen == {}  # choose / release on the handle as given

    asyncio.run(run())


@pytest.mark.parametrize("router", [FakeRouterHandle(delay_s=1.0), FakeRouterHandle(error=RuntimeError("down"))])
def test_unreachable_router_falls_back_locally_and_counts(router):
    async def run():
        metrics = Counter()
        client, pools = make_client(router, metrics=metrics)
        deltas = [d async for d in client.stream(REQ, RouteRequest("r", "m", 2, pool="tt"))]
        await asyncio.sleep(0.01)  # (the forget broadcast is fire-and-forget)
        assert deltas[-1].finished and pools["tt"].calls == [("r", None)]
        assert metrics.reasons in (["timeout"], ["RuntimeError"])
        assert router.released == [] and router.forgotten == ["r"]  # a late decision is not left counted

    asyncio.run(run())


def test_leaving_early_cancels_the_replica_call():
    async def run():
        router = FakeRouterHandle(RouteDecision("tt", "t1", "t1x", "least_loaded"))
        client, pools = make_client(router)
        gen = client.stream(REQ, RouteRequest("r", "m", 2))
        await gen.__anext__()
        await gen.aclose()
        assert pools["tt"].last.cancelled and router.released == ["t1x"]

    asyncio.run(run())


def test_engine_errors_become_api_errors():
    async def run():
        router = FakeRouterHandle(RouteDecision("tt", None, "", "x"))
        bad = {"tt": FakePoolHandle(lambda r: FakeStream([], InvalidRequestError("logprobs", "too many")))}
        client, _ = make_client(router, pools=bad)
        with pytest.raises(APIError) as err:
            [d async for d in client.stream(REQ, RouteRequest("r", "m", 2, pool="tt"))]
        assert (err.value.status, err.value.param) == (400, "logprobs")

        from ray.serve.exceptions import BackPressureError

        full = {"tt": FakePoolHandle(lambda r: FakeStream([], BackPressureError(5, 5, 503)))}
        client, _ = make_client(router, pools=full)
        with pytest.raises(APIError) as err:
            [d async for d in client.stream(REQ, RouteRequest("r", "m", 2, pool="tt"))]
        assert err.value.status == 503 and err.value.headers() == {"Retry-After": "2"}

    asyncio.run(run())


def test_bad_pin_is_a_400_without_rpc():
    client, _ = make_client(FakeRouterHandle())
    with pytest.raises(APIError) as err:
        client.check_routable(RouteRequest("r", "m", 2, pool="gpu"))
    assert err.value.param == "x-meshserve-pool"


def _membership_pools(app):
    """Pool handles that name their deployment, as Serve's handles do."""
    pools = {
        "tt": FakePoolHandle(lambda r: FakeStream([delta(r.request_id, 1, True)])),
        "vllm": FakePoolHandle(lambda r: FakeStream([delta(r.request_id, 1), delta(r.request_id, 2, True)])),
    }
    for name, handle in pools.items():
        handle.app_name, handle.deployment_name = app, f"Replica-{name}"
    return pools


def test_single_running_replica_is_used_without_a_router_round_trip():
    from deployments.handle_routing import replica_membership

    async def run():
        router = FakeRouterHandle(RouteDecision("vllm", "v1", "t1", "least_loaded"))
        client, pools = make_client(router, _membership_pools("single-app"))
        route = RouteRequest("r", "m", 2, pool="vllm")
        # Before Serve told this process anything about the pool: the router decides.
        assert [d.finished for d in [d async for d in client.stream(REQ, route)]] == [False, True]
        assert len(router.routes) == 1 and router.released == ["t1"]
        replica_membership.publish("single-app", "Replica-vllm", frozenset({"only"}))
        deltas = [d async for d in client.stream(REQ, route, placement=client.placement(route.needs))]
        assert [t for d in deltas for t in d.new_token_ids] == [1, 2] and deltas[-1].finished
        assert len(router.routes) == 1 and router.released == ["t1"]  # no choose, no ticket to release
        assert pools["vllm"].calls[-1] == ("r", "only")
        # Unpinned, the model has two eligible pools: the router decides between them.
        unpinned = RouteRequest("r", "m", 2)
        [d async for d in client.stream(REQ, unpinned, placement=client.placement(unpinned.needs))]
        assert len(router.routes) == 2
        # A second replica joined: the router decides again.
        replica_membership.publish("single-app", "Replica-vllm", frozenset({"only", "second"}))
        [d async for d in client.stream(REQ, route, placement=client.placement(route.needs))]
        assert len(router.routes) == 3

    asyncio.run(run())


def test_no_shortcut_for_a_model_with_a_prefill_pool_or_a_retry():
    from deployments.handle_routing import replica_membership

    replica_membership.publish("pd-app", "Replica-vllm", frozenset({"only"}))
    pd_pools = (pool_config("vllm", engine="vllm", role="decode"), pool_config("tt", role="prefill"))
    client = EngineClient(app_config(pd_pools), FakeRouterHandle(), _membership_pools("pd-app"))
    assert client.placement(PoolNeeds("m", "vllm")).by_router  # PD may apply
    router = FakeRouterHandle(RouteDecision("vllm", "second", "t2", "least_loaded"))
    dead = FakePoolHandle(lambda r: FakeStream([], dead_actor_error()))
    dead.app_name, dead.deployment_name = "pd-app", "Replica-vllm"
    client, _ = make_client(router, {**_membership_pools("pd-app"), "vllm": dead})
    placement = client.placement(PoolNeeds("m", "vllm"))
    assert placement.direct is not None and placement.direct.replica_id == "only"

    async def run():
        # The only replica dies before any token: the retry asks the router, without it.
        with pytest.raises(APIError):
            [d async for d in client.stream(REQ, RouteRequest("r", "m", 2, pool="vllm"), placement=placement)]
        [retry] = router.routes
        assert retry.excluded_replicas == ("only",) and retry.request_id == "r#retry"
        assert [c[1] for c in dead.calls] == ["only", "second"]

    asyncio.run(run())


def test_a_requests_choices_run_in_the_pool_its_first_was_placed_in():
    async def run():
        # The siblings ask the router with the first choice's pool pinned (as the header pins it).
        decisions = [RouteDecision("tt", "t1", "a", "prefix"), *(RouteDecision("tt", "t2", x, "load") for x in "bc")]
        router = FakeRouterHandle(decisions)
        client, pools = make_client(router)
        routes = [RouteRequest(f"r-{i}", "m", 2) for i in range(3)]
        streams = client.stream_choices([REQ, REQ, REQ], routes)
        deltas = [d async for _, d in merge_streams(streams)]
        assert sum(d.finished for d in deltas) == 3
        assert [r.pool for r in router.routes] == [None, "tt", "tt"]  # the siblings asked pinned
        assert pools["tt"].calls == [("r", "t1"), ("r", "t2"), ("r", "t2")] and not pools["vllm"].calls
        # A single choice, or a pool pinned by the client: each is routed as it is.
        assert len(client.stream_choices([REQ], routes[:1])) == 1
        pinned = [RouteRequest(f"p-{i}", "m", 2, pool="vllm") for i in range(2)]
        router = FakeRouterHandle(RouteDecision("vllm", "v1", "t", "load"))
        client, _ = make_client(router)
        [d async for _, d in merge_streams(client.stream_choices([REQ, REQ], pinned))]
        assert [r.pool for r in router.routes] == ["vllm", "vllm"]

    asyncio.run(run())


def test_siblings_end_when_the_first_choice_cannot_be_placed():
    async def run():
        client, _ = make_client(FakeRouterHandle(error=RuntimeError("down")))
        client.decide = _failing_decide
        streams = client.stream_choices([REQ, REQ], [RouteRequest(f"r-{i}", "m", 2) for i in range(2)])
        with pytest.raises(RuntimeError, match="no pool"):
            [d async for _, d in merge_streams(streams)]

    asyncio.run(asyncio.wait_for(run(), 5))


async def _failing_decide(route):
    raise RuntimeError("no pool")


def test_prefix_hashes_are_needed_only_when_the_router_decides():
    from deployments.handle_routing import replica_membership

    client, _ = make_client(FakeRouterHandle(), _membership_pools("hash-app"))
    assert client.placement(PoolNeeds("m", "vllm")).by_router  # nothing heard from Serve yet: the router decides
    replica_membership.publish("hash-app", "Replica-vllm", frozenset({"only"}))
    assert not client.placement(PoolNeeds("m", "vllm")).by_router  # the only replica, no router round trip
    assert client.placement(PoolNeeds("m")).by_router  # two eligible pools: the router chooses
    assert client.placement(PoolNeeds("m", "no-such-pool")).by_router  # (the request gets its 400 later)
    replica_membership.publish("hash-app", "Replica-vllm", frozenset({"only", "second"}))
    assert client.placement(PoolNeeds("m", "vllm")).by_router
    replica_membership.publish("hash-pd", "Replica-vllm", frozenset({"only"}))
    pd_pools = (pool_config("vllm", engine="vllm", role="decode"), pool_config("tt", role="prefill"))
    pd = EngineClient(app_config(pd_pools), FakeRouterHandle(), _membership_pools("hash-pd"))
    assert pd.placement(PoolNeeds("m", "vllm")).by_router  # a prefill pool: the router plans PD by prefix
