"""The router deployment as a plain class (no Ray): RouterCore decisions behind the Serve-facing
types, membership / stats / KV state from polled snapshots (precise for engines with KV events,
learned from routing otherwise), churn, ticket release, pinned pools, policy by name.
Pool handles are fakes with ``broadcast``."""

from __future__ import annotations

import asyncio

import pytest

from accel.block_hash import hash_prompt_blocks
from accel.contract import EngineStats
from deployments.route_types import PoolInfo, ReplicaSnapshot, RouteRequest, RoutingError, eligible_pools
from deployments.router.kv_events import BlockStored
from deployments.router.router_core import RouterConfig
from deployments.router_deployment import RouterDeployment

BS = 4
POOLS = (PoolInfo("tt", "m", "tt", "cpu", "both", BS), PoolInfo("vllm", "m", "vllm", "cpu", "both", BS))


class _Broadcast:
    def __init__(self, results, error=None):
        self._results, self._error = results, error

    async def results_async(self, return_exceptions=False):
        if self._error is not None:
            raise self._error
        return self._results


class FakePoolHandle:
    """``broadcast("routing_snapshot", synced_ids)``: each fake replica answers like
    ``EngineReplica.routing_snapshot`` (full blocks when not synced, else pending events)."""

    def __init__(self, snapshots, error=None):
        self.snapshots = snapshots
        self.error = error
        self.synced_args = []

    def broadcast(self, method, synced_ids=frozenset()):
        assert method == "routing_snapshot"
        self.synced_args.append(synced_ids)
        return _Broadcast([s(synced_ids) if callable(s) else s for s in self.snapshots], self.error)


def _snap(rid, pool, running=0, blocks=None, events=(), publishes=False):
    def answer(synced_ids):
        is_synced = rid in synced_ids
        return ReplicaSnapshot(rid, pool, EngineStats(0, running, 64, 64), running, BS, publishes,
                               tuple(events) if is_synced else (),
                               None if is_synced or not publishes else tuple(blocks or ()))
    return answer


def _ids(n, seed=0):
    return tuple(3 + (seed * 97 + i * 13) % 900 for i in range(n))


def _route(rid, ids=(), session=None, pool=None, model="m"):
    return RouteRequest(rid, model, len(ids), pool, session, tuple(hash_prompt_blocks(ids, BS)))


def _router(policy="prefix+session+load", tt=None, vllm=None, **kw):
    handles = {"tt": FakePoolHandle(tt if tt is not None else [_snap("t1", "tt"), _snap("t2", "tt")]),
               "vllm": FakePoolHandle(vllm if vllm is not None else [_snap("v1", "vllm", running=3)])}
    return RouterDeployment(POOLS, handles, stats_period_s=60, core_config=RouterConfig(policy=policy, index_mode="precise"), **kw), handles


def _inflight(router):
    return {v.replica_id: v.load.num_in_flight for v in router.snapshot().replicas}


def test_counts_in_flight_and_releases_on_end():
    async def run():
        router, _ = _router(policy="least_loaded")
        await router.refresh()
        decisions = [await router.choose(_route(f"r{i}")) for i in range(3)]
        assert sorted(d.replica_id for d in decisions) == ["t1", "t2", "v1"]
        assert router.snapshot().num_open_tickets == 3 and set(_inflight(router).values()) == {1}
        for d in decisions:
            router.release(d.ticket)
        router.release(decisions[0].ticket)  # completion + error reported: still one release
        assert set(_inflight(router).values()) == {0} and router.snapshot().num_open_tickets == 0
    asyncio.run(run())


def test_session_stays_on_one_replica_and_prefix_follows_history():
    async def run():
        router, _ = _router()
        await router.refresh()
        history, chosen = (), set()
        for turn in range(5):
            history = history + _ids(10, seed=turn)
            d = await router.choose(_route(f"s{turn}", history, session="chat-1"))
            chosen.add(d.replica_id)
            router.release(d.ticket)
        assert len(chosen) == 1 and router.session_replica("chat-1") in chosen
        # Without a session key the same history still lands where it is cached (approximate index).
        d = await router.choose(_route("x", history + _ids(8, 9)))
        assert d.replica_id in chosen and d.reason == "prefix"
    asyncio.run(run())


def test_precise_index_follows_engine_snapshot_then_events():
    async def run():
        prompt = _ids(16)
        hashes = hash_prompt_blocks(prompt, BS)
        # t2 already caches the prompt when the router starts (a restarted router): full snapshot.
        tt = [_snap("t1", "tt", publishes=True), _snap("t2", "tt", blocks=hashes, publishes=True)]
        router, handles = _router(tt=tt, vllm=[])
        await router.refresh()
        assert handles["tt"].synced_args[0] == frozenset()
        assert router.core.index.num_blocks("t2") == 4 and router.core.index.num_blocks("t1") == 0
        assert (await router.choose(_route("a", prompt))).replica_id == "t2"
        # Routing alone teaches a precise replica nothing; its KV events do.
        other = _ids(12, seed=5)
        d = await router.choose(_route("b", other))
        assert router.core.index.match(hash_prompt_blocks(other, BS), {d.replica_id}) == {}
        handles["tt"].snapshots = [_snap("t1", "tt", publishes=True,
                                         events=[BlockStored(tuple(hash_prompt_blocks(other, BS)))]),
                                   _snap("t2", "tt", publishes=True)]
        await router.refresh()
        assert handles["tt"].synced_args[-1] == frozenset({"t1", "t2"})
        assert router.core.index.num_blocks("t1") == 3
    asyncio.run(run())


def test_replica_without_events_is_learned_from_routing_in_precise_mode():
    async def run():
        router, _ = _router(tt=[], vllm=[_snap("v1", "vllm"), _snap("v2", "vllm")])
        await router.refresh()
        prompt = _ids(12)
        d = await router.choose(_route("a", prompt))
        assert router.core.index.num_blocks(d.replica_id) == 3
    asyncio.run(run())


def test_lost_poll_resyncs_from_a_full_snapshot():
    async def run():
        router, handles = _router(tt=[_snap("t1", "tt", publishes=True)], vllm=[])
        await router.refresh()
        handles["tt"].error = TimeoutError()
        await router.refresh()  # the answer (and its events) were lost: t1 kept, not synced
        assert [v.replica_id for v in router.snapshot().replicas] == ["t1"]
        handles["tt"].error = None
        await router.refresh()
        assert handles["tt"].synced_args[-1] == frozenset()  # asks t1 for its blocks again
    asyncio.run(run())


def test_dead_replica_is_removed_at_once_with_its_sessions_and_load():
    async def run():
        router, handles = _router(vllm=[])
        await router.refresh()
        d = await router.choose(_route("a", _ids(8), session="s"))
        dead = d.replica_id
        handles["tt"].snapshots = [s for s in handles["tt"].snapshots if s(frozenset()).replica_id != dead]
        await router.refresh()
        assert dead not in _inflight(router) and router.session_replica("s") is None
        d2 = await router.choose(_route("b", _ids(8), session="s"))
        assert d2.replica_id != dead
        router.release(d.ticket)  # the late release of a request on the dead replica is harmless
    asyncio.run(run())


def test_new_replica_gets_traffic():
    async def run():
        router, handles = _router(policy="least_loaded", tt=[_snap("t1", "tt")], vllm=[])
        await router.refresh()
        busy = await router.choose(_route("a"))
        handles["tt"].snapshots.append(_snap("t2", "tt"))
        await router.refresh()
        assert (await router.choose(_route("b"))).replica_id == "t2"
        router.release(busy.ticket)
    asyncio.run(run())


def test_pinned_pool_restricts_the_choice():
    async def run():
        router, _ = _router()
        await router.refresh()
        d = await router.choose(_route("a", _ids(8), pool="vllm"))
        assert (d.pool, d.replica_id, d.reason) == ("vllm", "v1", "pinned")
    asyncio.run(run())


def test_no_replica_known_yet_means_pool_only_decision():
    async def run():
        router = RouterDeployment(POOLS, {}, stats_period_s=60)
        d = await router.choose(_route("r", pool="vllm"))
        assert (d.pool, d.replica_id, d.reason, d.ticket) == ("vllm", None, "no_replica_known", "")
    asyncio.run(run())


def test_round_robin_alternates_regardless_of_cache():
    async def run():
        router, _ = _router(policy="round_robin", vllm=[])
        await router.refresh()
        picks = [(await router.choose(_route(f"r{i}", _ids(8), session="s"))).replica_id for i in range(4)]
        assert picks == ["t1", "t2", "t1", "t2"]
    asyncio.run(run())


def test_stale_tickets_expire():
    async def run():
        router, _ = _router(ticket_ttl_s=0.0)
        await router.refresh()
        await router.choose(_route("r"))
        await router.refresh()
        assert router.snapshot().num_open_tickets == 0 and set(_inflight(router).values()) == {0}
    asyncio.run(run())


def test_eligible_pools_and_bad_pins():
    pools = POOLS + (PoolInfo("pre", "m", "vllm", "tpu", "prefill"), PoolInfo("other", "m2", "tt", "cpu", "both"))
    assert [p.name for p in eligible_pools(_route("r"), pools)] == ["tt", "vllm"]
    assert [p.name for p in eligible_pools(_route("r", pool="pre"), pools)] == ["pre"]
    for pool, model in (("nope", "m"), ("other", "m")):
        with pytest.raises(RoutingError) as err:
            eligible_pools(_route("r", pool=pool, model=model), pools)
        assert err.value.param == "x-meshserve-pool"
    with pytest.raises(RoutingError) as err:
        eligible_pools(_route("r", model="m3"), pools)
    assert err.value.param == "model"


def test_forget_releases_a_decision_the_ingress_gave_up_on():
    async def run():
        router, _ = _router(vllm=[])
        await router.refresh()
        await router.choose(_route("late"))
        router.forget("late")
        router.forget("never-decided")
        assert router.snapshot().num_open_tickets == 0 and set(_inflight(router).values()) == {0}
    asyncio.run(run())


def test_capacity_follows_the_engine_report():
    async def run():
        router, handles = _router(tt=[_snap("t1", "tt")], vllm=[])
        await router.refresh()
        assert router.core.index.capacity("t1") == 64
        handles["tt"].snapshots = [lambda synced: ReplicaSnapshot("t1", "tt", EngineStats(0, 0, 32, 8), 0, 2 * BS)]
        await router.refresh()
        assert router.core.index.capacity("t1") == 64  # 32 engine blocks of 8 tokens = 64 routing blocks of 4
        handles["tt"].snapshots = [lambda synced: ReplicaSnapshot("t1", "tt", EngineStats(0, 0, 10, 8), 0, BS)]
        await router.refresh()
        assert router.core.index.capacity("t1") == 10
    asyncio.run(run())


def test_first_decision_polls_pools_it_has_not_seen():
    # Serve reports the app ready before the router's first poll: the first decision must not
    # miss replicas (nor PD) because of that.
    async def run():
        router, handles = _router(policy="least_loaded")
        decision = await router.choose(_route("r0"))
        assert decision.replica_id in {"t1", "t2", "v1"} and decision.reason != "no_replica_known"
        polls = len(handles["tt"].synced_args)
        await router.choose(_route("r1"))  # every pool seen: no extra poll on the decision path
        assert len(handles["tt"].synced_args) <= polls + 1  # (+1: the background loop's own)
    asyncio.run(run())
