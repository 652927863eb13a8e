"""The router deployment as a plain class (no Ray): RouterCore decisions behind the Serve-facing
types, membership / stats / KV state from polled snapshots (precise for engines with KV events,
learned from routing otherwise), churn, ticket release, pinned pools, policy by name.
Pool handles are fakes with ``broadcast``."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace

import pytest

from accel.block_hash import hash_prompt_blocks
from accel.contract import EngineStats
from deployments.kv_event_log import KVCursor, KVEventLog
from deployments.route_types import PoolInfo, ReplicaSnapshot, RouteRequest, RoutingError, eligible_pools
from deployments.router.kv_events import BlockRemoved, BlockStored
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
    """``broadcast("routing_snapshot", cursors)``: each fake replica answers like
    ``EngineReplica.routing_snapshot`` (full blocks without a usable cursor, else the events of
    its log after the cursor). ``cursor_args`` records what the router sent."""

    def __init__(self, snapshots, error=None):
        self.snapshots = snapshots
        self.error = error
        self.cursor_args = []

    def broadcast(self, method, cursors=None):
        assert method == "routing_snapshot"
        self.cursor_args.append(dict(cursors or {}))
        return _Broadcast([s(cursors or {}) if callable(s) else s for s in self.snapshots], self.error)


class _FakeReplica:
    """An engine replica's routing answers over a real ``KVEventLog``; ``events`` are logged at
    the first poll (what the engine had pending), ``emit`` logs more later."""

    def __init__(self, rid, pool, running=0, blocks=None, events=(), publishes=False, num_inflight=0):
        self.rid, self.pool, self.running, self.publishes = rid, pool, running, publishes
        self.num_inflight = num_inflight
        self.blocks = list(blocks or ())
        self.log = KVEventLog(64)
        self.pending = list(events)

    def emit(self, *events):
        self.pending.extend(events)

    def __call__(self, cursors):
        stats = EngineStats(0, self.running, 64, 64)
        if not self.publishes:
            return ReplicaSnapshot(self.rid, self.pool, stats, self.num_inflight, BS)
        head = self.log.append(self.pending)
        self.pending = []
        cursor = cursors.get(self.rid)
        since = self.log.read(cursor)
        if since is None:
            return ReplicaSnapshot(self.rid, self.pool, stats, self.num_inflight, BS, True, (),
                                   tuple(self.blocks), kv_cursor=head)
        return ReplicaSnapshot(self.rid, self.pool, stats, self.num_inflight, BS, True, since, None,
                               kv_cursor=head, kv_from_seq=cursor.seq)


def _snap(rid, pool, running=0, blocks=None, events=(), publishes=False, num_inflight=0):
    return _FakeReplica(rid, pool, running, blocks, events, publishes, num_inflight)


def _ids(n, seed=0):
    return tuple(3 + (seed * 97 + i * 13) % 900 for i in range(n))


def _route(rid, ids=(), session=None, pool=None, model="m"):
    return RouteRequest(rid, model, len(ids), pool, session, tuple(hash_prompt_blocks(ids, BS)))


def _router(policy="prefix+session+load", tt=None, vllm=None, **kw):
    handles = {"tt": FakePoolHandle(tt if tt is not None else [_snap("t1", "tt"), _snap("t2", "tt")]),
               "vllm": FakePoolHandle(vllm if vllm is not None else [_snap("v1", "vllm", running=3)])}
    return RouterDeployment(POOLS, handles, stats_period_s=60, core_config=RouterConfig(policy=policy, index_mode="precise"), **kw), handles


async def _inflight(router):
    return {v.replica_id: v.load.num_in_flight for v in (await router.snapshot()).replicas}


def test_counts_in_flight_and_releases_on_end():
    async def run():
        router, _ = _router(policy="least_loaded")
        await router.refresh()
        decisions = [await router.choose(_route(f"r{i}")) for i in range(3)]
        assert sorted(d.replica_id for d in decisions) == ["t1", "t2", "v1"]
        assert (await router.snapshot()).num_open_tickets == 3 and set((await _inflight(router)).values()) == {1}
        for d in decisions:
            await router.release(d.ticket)
        await router.release(decisions[0].ticket)  # completion + error reported: still one release
        assert set((await _inflight(router)).values()) == {0} and (await router.snapshot()).num_open_tickets == 0
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
            await router.release(d.ticket)
        assert len(chosen) == 1 and (await router.session_replica("chat-1")) in chosen
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
        assert handles["tt"].cursor_args[0] == {}  # no cursors yet: full snapshots
        assert router.core.index.num_blocks("t2") == 4 and router.core.index.num_blocks("t1") == 0
        assert (await router.choose(_route("a", prompt))).replica_id == "t2"
        # Routing alone teaches a precise replica nothing; its KV events do.
        other = _ids(12, seed=5)
        d = await router.choose(_route("b", other))
        assert router.core.index.match(hash_prompt_blocks(other, BS), {d.replica_id}) == {}
        tt[0].emit(BlockStored(tuple(hash_prompt_blocks(other, BS))))
        await router.refresh()
        assert handles["tt"].cursor_args[-1] == {"t1": KVCursor(tt[0].log.log_id, 0),
                                                 "t2": KVCursor(tt[1].log.log_id, 0)}
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


def test_lost_poll_rereads_from_the_same_cursor():
    async def run():
        t1 = _snap("t1", "tt", publishes=True)
        router, handles = _router(tt=[t1], vllm=[])
        await router.refresh()
        t1.emit(BlockStored((11, 12)))
        handles["tt"].error = TimeoutError()
        # The poll reached t1 (its events are logged) but the answer was lost: t1 kept.
        handles["tt"].snapshots = [lambda cursors: (t1(cursors), None)[1]]
        await router.refresh()
        assert [v.replica_id for v in (await router.snapshot()).replicas] == ["t1"]
        handles["tt"].error, handles["tt"].snapshots = None, [t1]
        await router.refresh()
        assert handles["tt"].cursor_args[-1]["t1"] == KVCursor(t1.log.log_id, 0)  # the same cursor again
        assert router.core.index.holds("t1", 11) and router.core.index.holds("t1", 12)
    asyncio.run(run())


def test_restarted_engine_replica_and_overflowed_log_resync_from_snapshots():
    async def run():
        t1 = _snap("t1", "tt", blocks=(1, 2), publishes=True)
        router, handles = _router(tt=[t1], vllm=[])
        await router.refresh()
        assert router.core.index.holds("t1", 1)
        # The engine replica restarts under the same id: a new log (and empty cache).
        reborn = _snap("t1", "tt", blocks=(3,), publishes=True)
        handles["tt"].snapshots = [reborn]
        await router.refresh()
        assert not router.core.index.holds("t1", 1) and router.core.index.holds("t1", 3)
        # The router falls further behind than the log holds: a full snapshot again.
        # (70 events, a log of 64; the engine holds only the last 10 of them now.)
        reborn.emit(*(BlockStored((h,)) for h in range(100, 170)))
        reborn.blocks = [3] + list(range(160, 170))
        await router.refresh()
        assert router.core.index.num_blocks("t1") == 11 and router.core.index.holds("t1", 169)
    asyncio.run(run())


def test_an_answer_to_an_older_cursor_is_not_applied():
    async def run():
        t1 = _snap("t1", "tt", publishes=True)
        router, _ = _router(tt=[t1], vllm=[])
        await router.refresh()
        start = {"t1": t1.log.head}
        t1.emit(BlockStored((5,)))
        first = t1(start)  # two polls in flight from the same cursor (on-demand + periodic)
        t1.emit(BlockRemoved((5,)))
        second = t1(start)
        router.engines.apply_snapshot(second)
        router.engines.apply_snapshot(first)  # arrives late: must not store 5 again
        assert not router.core.index.holds("t1", 5)
    asyncio.run(run())


def test_dead_replica_is_removed_at_once_with_its_sessions_and_load():
    async def run():
        router, handles = _router(vllm=[])
        await router.refresh()
        d = await router.choose(_route("a", _ids(8), session="s"))
        dead = d.replica_id
        handles["tt"].snapshots = [s for s in handles["tt"].snapshots if s.rid != dead]
        await router.refresh()
        assert dead not in await _inflight(router) and (await router.session_replica("s")) is None
        d2 = await router.choose(_route("b", _ids(8), session="s"))
        assert d2.replica_id != dead
        await router.release(d.ticket)  # the late release of a request on the dead replica is harmless
    asyncio.run(run())


def test_new_replica_gets_traffic():
    async def run():
        router, handles = _router(policy="least_loaded", tt=[_snap("t1", "tt")], vllm=[])
        await router.refresh()
        busy = await router.choose(_route("a"))
        handles["tt"].snapshots.append(_snap("t2", "tt"))
        await router.refresh()
        assert (await router.choose(_route("b"))).replica_id == "t2"
        await router.release(busy.ticket)
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
        assert (await router.snapshot()).num_open_tickets == 0 and set((await _inflight(router)).values()) == {0}
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
        await router.forget("late")
        await router.forget("never-decided")
        assert (await router.snapshot()).num_open_tickets == 0 and set((await _inflight(router)).values()) == {0}
    asyncio.run(run())


def test_capacity_follows_the_engine_report():
    async def run():
        router, handles = _router(tt=[_snap("t1", "tt")], vllm=[])
        await router.refresh()
        assert router.core.index.capacity("t1") == 64
        handles["tt"].snapshots = [lambda cursors: ReplicaSnapshot("t1", "tt", EngineStats(0, 0, 32, 8), 0, 2 * BS)]
        await router.refresh()
        assert router.core.index.capacity("t1") == 64  # 32 engine blocks of 8 tokens = 64 routing blocks of 4
        handles["tt"].snapshots = [lambda cursors: ReplicaSnapshot("t1", "tt", EngineStats(0, 0, 10, 8), 0, BS)]
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
        polls = len(handles["tt"].cursor_args)
        await router.choose(_route("r1"))  # every pool seen: no extra poll on the decision path
        assert len(handles["tt"].cursor_args) <= polls + 1  # (+1: the background loop's own)
    asyncio.run(run())


# -- several router replicas ----------------------------------------------------------------------

class _KVEngine:
    """An engine with the TT engine's KV-event surface and a block set that ``store`` / ``evict``
    change (publishing the events), so real ``EngineReplica`` logs can be polled."""

    def __init__(self):
        self.blocks: dict[int, None] = {}
        self._events = []

    def store(self, hashes):
        new = [h for h in hashes if h not in self.blocks]
        self.blocks.update(dict.fromkeys(new))
        self._events.append(SimpleNamespace(kind="stored", lane=0, block_hashes=new))

    def evict(self, hashes):
        for h in hashes:
            self.blocks.pop(h, None)
        self._events.append(SimpleNamespace(kind="removed", lane=0, block_hashes=list(hashes)))

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
        return _Broadcast([a for r, a in zip(self.replicas, answers) if r.replica_id not in self.dropped])


def _engine_replicas(n, log_size=64):
    from deployments.engine_replica import EngineReplica

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
        router = RouterDeployment(POOLS[:1], {"tt": handle}, stats_period_s=60,
                                  core_config=RouterConfig(index_mode="precise"), **kw)
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
        truth = tuple((f"t{i + 1}", tuple(h for h in probe if h in e.blocks), len(e.blocks))
                      for i, e in enumerate(engines))
        assert view_a.replicas == truth
        assert (view_a.router_replica_id, view_b.router_replica_id) == ("router-a", "router-b")
    asyncio.run(run())


def test_decisions_name_their_router_replica_and_releases_stay_local():
    async def run():
        _, replicas = _engine_replicas(2)
        (a, _), (b, _) = _two_routers(replicas)
        await a.refresh()
        await b.refresh()
        d = await a.choose(_route("r1", _ids(8), session="s"))
        assert d.router_replica_id == "router-a" and d.ticket
        await b.release(d.ticket)  # the wrong router replica: nothing happens there
        assert (await a.snapshot()).num_open_tickets == 1
        await a.release(d.ticket, replica_hint="router-a")
        assert (await a.snapshot()).num_open_tickets == 0
    asyncio.run(run())


def test_what_other_routers_have_in_flight_counts_as_load():
    async def run():
        # t1 reports 6 requests in flight that this router did not dispatch (another router's).
        router, _ = _router(policy="least_loaded", tt=[_snap("t1", "tt", num_inflight=6), _snap("t2", "tt")],
                            vllm=[])
        await router.refresh()
        picks = [(await router.choose(_route(f"r{i}"))).replica_id for i in range(5)]
        assert picks == ["t2"] * 5  # t2 reaches 5 of ours while t1 carries 6 foreign requests
        load = (await router.snapshot()).replicas[0].load
        assert (load.num_foreign_in_flight, load.num_waiting) == (6, 0)
        # Its own requests are not counted twice: the replica reports them, the router knows them.
        router2, handles = _router(policy="least_loaded", tt=[_snap("t1", "tt"), _snap("t2", "tt")], vllm=[])
        await router2.refresh()
        mine = await router2.choose(_route("x"))
        handles["tt"].snapshots = [_snap(r, "tt", num_inflight=1 if r == mine.replica_id else 0) for r in ("t1", "t2")]
        await router2.refresh()
        assert all(v.load.num_waiting == 0 for v in (await router2.snapshot()).replicas)
    asyncio.run(run())


def test_reported_dead_replica_is_dropped_at_once_and_readded_when_it_answers():
    async def run():
        t1 = _snap("t1", "tt")
        t1_actor = "a1b2"
        handles_snaps = [lambda c: dataclasses.replace(t1(c), actor_id=t1_actor), _snap("t2", "tt")]
        router, handles = _router(tt=handles_snaps, vllm=[])
        await router.refresh()
        d = await router.choose(_route("a", _ids(8), session="s", pool="tt"))
        victim = d.replica_id
        # By actor id (exact), else by the replica id the decision named; no poll in between.
        if victim == "t1":
            await router.report_dead(None, t1_actor)
        else:
            await router.report_dead(victim)
        assert victim not in await _inflight(router) and (await router.session_replica("s")) is None
        everyone = handles["tt"].snapshots
        handles["tt"].snapshots = [everyone[1] if victim == "t1" else everyone[0]]  # it stays silent
        for i in range(4):
            assert (await router.choose(_route(f"b{i}", _ids(8), session="s"))).replica_id != victim
        await router.report_dead("unknown-replica")  # harmless
        handles["tt"].snapshots = everyone  # (it was only unreachable)
        await router.refresh()  # a later poll that the replica answers: routed to again
        assert victim in await _inflight(router)
    asyncio.run(run())


def test_poll_answers_sent_before_a_death_report_are_ignored():
    async def run():
        router, handles = _router(tt=[_snap("t1", "tt"), _snap("t2", "tt")], vllm=[])
        await router.refresh()
        release = asyncio.Event()

        class SlowBroadcast(_Broadcast):
            async def results_async(self, return_exceptions=False):
                await release.wait()
                return self._results

        handles["tt"].broadcast = lambda method, cursors=None: SlowBroadcast(
            [s(cursors or {}) for s in handles["tt"].snapshots])
        poll = asyncio.ensure_future(router.refresh())
        await asyncio.sleep(0)
        await router.report_dead("t1")
        release.set()
        await poll  # its answer from t1 predates the report
        assert "t1" not in await _inflight(router)
    asyncio.run(run())


def test_retry_excludes_the_dead_choice():
    async def run():
        router, _ = _router(vllm=[])
        await router.refresh()
        first = await router.choose(_route("r", _ids(8)))
        retry = await router.choose(dataclasses.replace(_route("r#retry", _ids(8)),
                                                        excluded_replicas=(first.replica_id,)))
        assert retry.replica_id not in (None, first.replica_id)
        alone = await router.choose(dataclasses.replace(_route("q", _ids(8)), excluded_replicas=("t1", "t2")))
        assert (alone.replica_id, alone.reason) == (None, "no_replica_known")
    asyncio.run(run())


def test_peer_router_counts_are_load_and_our_own_broadcast_is_ignored():
    async def run():
        router, _ = _router(policy="least_loaded", tt=[_snap("t1", "tt"), _snap("t2", "tt")], vllm=[])
        await router.refresh()
        await router.peer_load(router.replica_id, {"t2": 50})  # our own broadcast comes back: ignored
        await router.peer_load("router-b", {"t1": 6})
        picks = [(await router.choose(_route(f"r{i}"))).replica_id for i in range(5)]
        assert picks == ["t2"] * 5  # t1 carries the peer's 6 requests
        assert router.core.in_flight_counts() == {"t2": 5}  # what this router publishes
    asyncio.run(run())
