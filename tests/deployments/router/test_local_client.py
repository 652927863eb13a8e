"""The router inside the ingress (``router.placement: ingress``): ``LocalRouterClient`` over a
``RouterDeployment`` built in this process; pool handles are the router's fakes (``router_fakes``)."""

from __future__ import annotations

import asyncio

from deployments.config.router import RouterConfig
from deployments.router.client import RouterClient, router_calls
from deployments.router.local_client import LocalRouterClient
from tests.doubles.app_configs import app_config
from tests.doubles.router_fakes import POOLS, in_flight_counts, make_router, prompt_ids, route_request
from tests.serve_app.http.engine_doubles import FakeRouterHandle


def test_decisions_count_load_and_release_in_process():
    async def run():
        router, _ = make_router(policy="least_loaded")
        client = LocalRouterClient(router)
        decisions = [await client.choose(route_request(f"r{i}"), timeout_s=0.2) for i in range(3)]
        assert sorted(d.replica_id for d in decisions) == ["t1", "t2", "v1"]
        assert set((await in_flight_counts(router)).values()) == {1}
        for d in decisions:
            client.release(d, d.ticket)
        client.release(decisions[0], decisions[0].ticket)  # released twice: still one release
        assert set((await in_flight_counts(router)).values()) == {0}
        assert (await router.snapshot()).num_open_tickets == 0

    asyncio.run(run())


def test_sessions_stick_and_forget_and_dead_reports_reach_the_router():
    async def run():
        router, _ = make_router()
        client = LocalRouterClient(router)
        await client.check_health()  # starts the router's poll loop, as the ingress's probe does
        history, chosen = (), set()
        for turn in range(3):
            history = history + prompt_ids(10, seed=turn)
            d = await client.choose(route_request(f"s{turn}", history, session="chat"), timeout_s=0.2)
            chosen.add(d.replica_id)
            client.release(d, d.ticket)
        assert len(chosen) == 1
        late = await client.choose(route_request("late"), timeout_s=0.2)
        client.forget("late")
        (dead,) = chosen
        client.report_dead(dead, None)
        await asyncio.sleep(0.01)  # (both are fire and forget, as over Serve)
        assert (await router.snapshot()).num_open_tickets == 0 and late.ticket
        assert dead not in router.engines.replica_pool and await router.session_replica("chat") is None

    asyncio.run(run())


def test_lora_adapters_and_metrics_come_from_the_one_router():
    async def run():
        router, _ = make_router()
        client = LocalRouterClient(router)
        await client.set_lora_adapter("a", "/tmp/a")
        await client.set_lora_adapter("b", None)
        assert await client.lora_adapters(timeout_s=1) == {"a": "/tmp/a", "b": None}
        assert len(await client.metrics_snapshots(timeout_s=1)) == 1

    asyncio.run(run())


def test_placement_picks_the_client():
    config = app_config(POOLS, RouterConfig(placement="ingress"))
    local = router_calls(config, None, {}, by_value=True)
    assert isinstance(local, LocalRouterClient) and local.router.logic is not None
    own = router_calls(app_config(POOLS, RouterConfig()), FakeRouterHandle(), {}, by_value=True)
    assert isinstance(own, RouterClient)
