"""The router deployment as a plain class (no Ray): RouterLogic decisions behind the Serve-facing
types, tickets and their release, sessions, churn, pinned pools, policy by name, on-demand polls.
Pool handles are fakes with ``broadcast`` (``router_fakes``)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from deployments.config.router import RouterConfig
from deployments.messages.routing import RoutingError, eligible_pools
from deployments.router.deployment import RouterDeployment
from tests.doubles.app_configs import app_config, pool_config
from tests.doubles.router_fakes import (
    POOLS,
    in_flight_counts,
    make_router,
    make_snap,
    prompt_ids,
    route_request,
)


def test_counts_in_flight_and_releases_on_end():
    async def run():
        router, _ = make_router(policy="least_loaded")
        await router.refresh()
        decisions = [await router.choose(route_request(f"r{i}")) for i in range(3)]
        assert sorted(d.replica_id for d in decisions) == ["t1", "t2", "v1"]
        assert (await router.snapshot()).num_open_tickets == 3 and set((await in_flight_counts(router)).values()) == {1}
        for d in decisions:
            await router.release(d.ticket)
        await router.release(decisions[0].ticket)  # completion + error reported: still one release
        assert set((await in_flight_counts(router)).values()) == {0} and (await router.snapshot()).num_open_tickets == 0

    asyncio.run(run())


def test_session_stays_on_one_replica_and_prefix_follows_history():
    async def run():
        router, _ = make_router()
        await router.refresh()
        history, chosen = (), set()
        for turn in range(5):
            history = history + prompt_ids(10, seed=turn)
            d = await router.choose(route_request(f"s{turn}", history, session="chat-1"))
            chosen.add(d.replica_id)
            await router.release(d.ticket)
        assert len(chosen) == 1 and (await router.session_replica("chat-1")) in chosen
        # Without a session key the same history still lands where it is cached (approximate index).
        d = await router.choose(route_request("x", history + prompt_ids(8, 9)))
        assert d.replica_id in chosen and d.reason == "prefix"

    asyncio.run(run())


def test_dead_replica_is_removed_at_once_with_its_sessions_and_load():
    async def run():
        router, handles = make_router(vllm=[])
        await router.refresh()
        d = await router.choose(route_request("a", prompt_ids(8), session="s"))
        dead = d.replica_id
        handles["tt"].snapshots = [s for s in handles["tt"].snapshots if s.rid != dead]
        await router.refresh()
        assert dead not in await in_flight_counts(router) and (await router.session_replica("s")) is None
        d2 = await router.choose(route_request("b", prompt_ids(8), session="s"))
        assert d2.replica_id != dead
        await router.release(d.ticket)  # the late release of a request on the dead replica is harmless

    asyncio.run(run())


def test_new_replica_gets_traffic():
    async def run():
        router, handles = make_router(policy="least_loaded", tt=[make_snap("t1", "tt")], vllm=[])
        await router.refresh()
        busy = await router.choose(route_request("a"))
        handles["tt"].snapshots.append(make_snap("t2", "tt"))
        await router.refresh()
        assert (await router.choose(route_request("b"))).replica_id == "t2"
        await router.release(busy.ticket)

    asyncio.run(run())


def test_pinned_pool_restricts_the_choice():
    async def run():
        router, _ = make_router()
        await router.refresh()
        d = await router.choose(route_request("a", prompt_ids(8), pool="vllm"))
        assert (d.pool, d.replica_id, d.reason) == ("vllm", "v1", "pinned")

    asyncio.run(run())


def test_no_replica_known_yet_means_pool_only_decision():
    async def run():
        router = RouterDeployment(app_config(POOLS, RouterConfig(stats_period_s=60)), {})
        d = await router.choose(route_request("r", pool="vllm"))
        assert (d.pool, d.replica_id, d.reason, d.ticket) == ("vllm", None, "no_replica_known", "")

    asyncio.run(run())


def test_round_robin_alternates_regardless_of_cache():
    async def run():
        router, _ = make_router(policy="round_robin", vllm=[])
        await router.refresh()
        picks = [(await router.choose(route_request(f"r{i}", prompt_ids(8), session="s"))).replica_id for i in range(4)]
        assert picks == ["t1", "t2", "t1", "t2"]

    asyncio.run(run())


def test_stale_tickets_expire():
    async def run():
        router, _ = make_router(ticket_ttl_s=0.0)
        await router.refresh()
        await router.choose(route_request("r"))
        await router.refresh()
        assert (await router.snapshot()).num_open_tickets == 0 and set((await in_flight_counts(router)).values()) == {0}

    asyncio.run(run())


def test_eligible_pools_and_bad_pins():
    pools = POOLS + (pool_config("pre", "m", "vllm", "tpu", "prefill"), pool_config("other", "m2", "tt", "cpu", "both"))
    assert [p.name for p in eligible_pools(route_request("r"), pools)] == ["tt", "vllm"]
    assert [p.name for p in eligible_pools(route_request("r", pool="pre"), pools)] == ["pre"]
    for pool, model in (("nope", "m"), ("other", "m")):
        with pytest.raises(RoutingError) as err:
            eligible_pools(route_request("r", pool=pool, model=model), pools)
        assert err.value.param == "x-meshserve-pool"
    with pytest.raises(RoutingError) as err:
        eligible_pools(route_request("r", model="m3"), pools)
    assert err.value.param == "model"


def test_forget_releases_a_decision_the_ingress_gave_up_on():
    async def run():
        router, _ = make_router(vllm=[])
        await router.refresh()
        await router.choose(route_request("late"))
        await router.forget("late")
        await router.forget("never-decided")
        assert (await router.snapshot()).num_open_tickets == 0 and set((await in_flight_counts(router)).values()) == {0}

    asyncio.run(run())


def test_first_decision_polls_pools_it_has_not_seen():
    # Serve reports the app ready before the router's first poll: the first decision must not
    # miss replicas (nor PD) because of that.
    async def run():
        router, handles = make_router(policy="least_loaded")
        decision = await router.choose(route_request("r0"))
        assert decision.replica_id in {"t1", "t2", "v1"} and decision.reason != "no_replica_known"
        polls = len(handles["tt"].cursor_args)
        await router.choose(route_request("r1"))  # every pool seen: no extra poll on the decision path
        assert len(handles["tt"].cursor_args) <= polls + 1  # (+1: the background loop's own)

    asyncio.run(run())


def test_retry_excludes_the_dead_choice():
    async def run():
        router, _ = make_router(vllm=[])
        await router.refresh()
        first = await router.choose(route_request("r", prompt_ids(8)))
        retry = await router.choose(
            dataclasses.replace(route_request("r#retry", prompt_ids(8)), excluded_replicas=(first.replica_id,))
        )
        assert retry.replica_id not in (None, first.replica_id)
        alone = await router.choose(
            dataclasses.replace(route_request("q", prompt_ids(8)), excluded_replicas=("t1", "t2"))
        )
        assert (alone.replica_id, alone.reason) == (None, "no_replica_known")

    asyncio.run(run())
