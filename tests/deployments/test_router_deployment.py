"""The router deployment as a plain class: membership from polled snapshots, in-flight
accounting through tickets, stale-ticket expiry. Pool handles are fakes with ``broadcast``."""

from __future__ import annotations

import asyncio

from accel.contract import EngineStats
from deployments.route_types import PoolInfo, ReplicaSnapshot, RouteRequest
from deployments.router_deployment import RouterDeployment

POOLS = (PoolInfo("tt", "m", "tt", "cpu", "both"), PoolInfo("vllm", "m", "vllm", "cpu", "both"))


class _Broadcast:
    def __init__(self, results):
        self._results = results

    async def results_async(self, return_exceptions=False):
        return self._results


class FakePoolHandle:
    def __init__(self, snapshots):
        self.snapshots = snapshots

    def broadcast(self, method):
        assert method == "routing_snapshot"
        return _Broadcast(list(self.snapshots))


def _snap(rid, pool, running=0):
    return ReplicaSnapshot(rid, pool, EngineStats(0, running, 8, 8), running)


def _router():
    handles = {"tt": FakePoolHandle([_snap("t1", "tt"), _snap("t2", "tt")]),
               "vllm": FakePoolHandle([_snap("v1", "vllm", running=3)])}
    return RouterDeployment(POOLS, handles, stats_period_s=60), handles


def test_spreads_by_inflight_and_releases():
    async def run():
        router, _ = _router()
        await router.refresh()
        decisions = [await router.choose(RouteRequest(f"r{i}", "m", 4)) for i in range(4)]
        assert sorted(d.replica_id for d in decisions) == ["t1", "t1", "t2", "t2"]
        snap = router.snapshot()
        assert snap.num_open_tickets == 4
        assert {r.replica_id: r.num_routed_inflight for r in snap.replicas} == {"t1": 2, "t2": 2, "v1": 0}
        for d in decisions:
            router.release(d.ticket)
        router.release(decisions[0].ticket)  # double release is harmless
        assert all(r.num_routed_inflight == 0 for r in router.snapshot().replicas)
    asyncio.run(run())


def test_replicas_that_vanish_are_forgotten():
    async def run():
        router, handles = _router()
        await router.refresh()
        handles["tt"].snapshots = [_snap("t2", "tt")]
        await router.refresh()
        assert {r.replica_id for r in router.snapshot().replicas} == {"t2", "v1"}
    asyncio.run(run())


def test_unknown_replicas_mean_pool_only_decision():
    async def run():
        router = RouterDeployment(POOLS, {}, stats_period_s=60)
        d = await router.choose(RouteRequest("r", "m", 4, pool="vllm"))
        assert (d.pool, d.replica_id, d.reason) == ("vllm", None, "no_replica_known")
    asyncio.run(run())


def test_stale_tickets_expire():
    async def run():
        router, _ = _router()
        router._ticket_ttl_s = 0.0
        await router.refresh()
        await router.choose(RouteRequest("r", "m", 4))
        await router.refresh()
        assert router.snapshot().num_open_tickets == 0
    asyncio.run(run())
