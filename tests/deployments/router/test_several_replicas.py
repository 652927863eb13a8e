"""Several router replicas over real ``EngineReplica`` event logs (no Ray): each follows every
event from its own cursor and agrees with the engines, decisions and releases stay on their router
replica, and each counts the others' requests in flight as load."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from accel.contract import EngineStats, PrefixCacheChange
from deployments.config.router import RouterConfig
from deployments.router.deployment import RouterDeployment
from tests.doubles.app_configs import app_config
from tests.doubles.router_fakes import (
    BS,
    POOLS,
    Broadcast,
    make_router,
    make_snap,
    prompt_ids,
    route_request,
)


class _KVEngine:
    """An engine with the TT engine's KV-event surface and a block set that ``store`` / ``evict``
    change (publishing the events), so real ``EngineReplica`` logs can be polled."""

    block_size = BS

    def __init__(self):
        self.blocks: dict[int, None] = {}
        self._events = []

    def store(self, hashes):
        new = [h for h in hashes if h not in self.blocks]
        self.blocks.update(dict.fromkeys(new))
        self._events.append(PrefixCacheChange("stored", 0, tuple(new)))

    def evict(self, hashes):
        for h in hashes:
            self.blocks.pop(h, None)
        self._events.append(PrefixCacheChange("removed", 0, tuple(hashes)))

    def extra_stats(self):
        return None

    def take_kv_events(self):
        events, self._events = self._events, []
        return events

    def kv_block_snapshot(self):
        return list(self.blocks)

    def stats(self):
        return EngineStats(0, 0, 64, 64 - len(self.blocks))


class _ReplicaPool:
    """Fake pool handle whose broadcast reaches real ``EngineReplica.routing_snapshot``s."""

    def __init__(self, replicas, dropped=None):
        self.replicas, self.dropped = replicas, dropped or set()

    def broadcast(self, method, cursors=None):
        answers = [getattr(r, method)(cursors) for r in self.replicas]  # every poll reaches the replicas
        return Broadcast([a for r, a in zip(self.replicas, answers) if r.replica_id not in self.dropped])


def _engine_replicas(n, log_size=64):
    from deployments.replicas.engine_replica import EngineReplica

    pool = SimpleNamespace(name="tt", model="m", block_size=BS)
    engines = [_KVEngine() for _ in range(n)]
    replicas = []
    for i, engine in enumerate(engines):
        replica = EngineReplica(pool, lambda p, e=engine: e, kv_event_log_size=log_size)
        replica.replica_id = f"t{i + 1}"
        replicas.append(replica)
    return engines, replicas


def _two_routers(replicas, **kw):
    routers = []
    for name in ("router-a", "router-b"):
        handle = _ReplicaPool(replicas)
        config = app_config(POOLS[:1], RouterConfig(index_mode="precise", stats_period_s=60))
        router = RouterDeployment(config, {"tt": handle}, **kw)
        router.replica_id = name
        routers.append((router, handle))
    return routers


def test_router_replicas_follow_every_event_and_agree_with_the_engines():
    async def run():
        import ray

        engines, replicas = _engine_replicas(2, log_size=16)
        assert not ray.is_initialized()  # (a replica built outside Ray must not start one)
        (a, pool_a), (b, pool_b) = _two_routers(replicas)
        engines[0].store([1, 2, 3])
        await a.refresh()  # a starts early (snapshot), b only later
        engines[0].store([4])
        engines[1].store([5, 6])
        await a.refresh()
        await b.refresh()
        for step in range(30):  # churn; a polls every step, b every 4th and loses one answer
            engine = engines[step % 2]
            engine.store([100 + step, 200 + step])
            if step % 3 == 0:
                engine.evict([100 + step - 3 if step >= 3 else 1])
            await a.refresh()
            if step % 4 == 3:
                pool_b.dropped = {"t2"} if step == 7 else set()
                await b.refresh()
        pool_b.dropped = set()
        await b.refresh()
        await a.refresh()
        probe = sorted({h for e in engines for h in e.blocks} | set(range(1, 7)) | set(range(100, 240)))
        view_a, view_b = await a.prefix_index_view(probe), await b.prefix_index_view(probe)
        assert view_a.replicas == view_b.replicas
        truth = tuple(
            (f"t{i + 1}", tuple(h for h in probe if h in e.blocks), len(e.blocks)) for i, e in enumerate(engines)
        )
        assert view_a.replicas == truth
        assert (view_a.router_replica_id, view_b.router_replica_id) == ("router-a", "router-b")

    asyncio.run(run())


def test_decisions_name_their_router_replica_and_releases_stay_local():
    async def run():
        _, replicas = _engine_replicas(2)
        (a, _), (b, _) = _two_routers(replicas)
        await a.refresh()
        await b.refresh()
        d = await a.choose(route_request("r1", prompt_ids(8), session="s"))
        assert d.router_replica_id == "router-a" and d.ticket
        await b.release(d.ticket)  # the wrong router replica: nothing happens there
        assert (await a.snapshot()).num_open_tickets == 1
        await a.release(d.ticket, replica_hint="router-a")
        assert (await a.snapshot()).num_open_tickets == 0

    asyncio.run(run())


def test_what_other_routers_have_in_flight_counts_as_load():
    async def run():
        # t1 reports 6 requests in flight that this router did not dispatch (another router's).
        router, _ = make_router(
            policy="least_loaded", tt=[make_snap("t1", "tt", num_inflight=6), make_snap("t2", "tt")], vllm=[]
        )
        await router.refresh()
        picks = [(await router.choose(route_request(f"r{i}"))).replica_id for i in range(5)]
        assert picks == ["t2"] * 5  # t2 reaches 5 of ours while t1 carries 6 foreign requests
        load = (await router.snapshot()).replicas[0].load
        assert (load.num_foreign_in_flight, load.num_waiting) == (6, 0)
        # Its own requests are not counted twice: the replica reports them, the router knows them.
        router2, handles = make_router(
            policy="least_loaded", tt=[make_snap("t1", "tt"), make_snap("t2", "tt")], vllm=[]
        )
        await router2.refresh()
        mine = await router2.choose(route_request("x"))
        handles["tt"].snapshots = [
            make_snap(r, "tt", num_inflight=1 if r == mine.replica_id else 0) for r in ("t1", "t2")
        ]
        await router2.refresh()
        assert all(v.load.num_waiting == 0 for v in (await router2.snapshot()).replicas)

    asyncio.run(run())


def test_peer_router_counts_are_load_and_our_own_broadcast_is_ignored():
    async def run():
        router, _ = make_router(policy="least_loaded", tt=[make_snap("t1", "tt"), make_snap("t2", "tt")], vllm=[])
        await router.refresh()
        await router.peer_load(router.replica_id, {"t2": 50})  # our own broadcast comes back: ignored
        await router.peer_load("router-b", {"t1": 6})
        picks = [(await router.choose(route_request(f"r{i}"))).replica_id for i in range(5)]
        assert picks == ["t2"] * 5  # t1 carries the peer's 6 requests
        assert router.logic.in_flight_counts() == {"t2": 5}  # what this router publishes

    asyncio.run(run())
