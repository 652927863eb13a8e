"""What a router replica learns from its polls (``deployments.router.engine_view.EngineView`` inside the
deployment): precise index from engine snapshots and KV events followed by cursor, resync after a
lost poll, a restarted engine or an overflowed log, stale answers ignored, capacity, replicas
reported dead."""

from __future__ import annotations

import asyncio
import dataclasses

from accel.block_hash import hash_prompt_blocks
from accel.contract import EngineStats
from deployments.messages.kv_events import BlockRemoved, BlockStored, KVCursor
from deployments.messages.replica_snapshot import ReplicaSnapshot
from tests.doubles.router_fakes import (
    BS,
    Broadcast,
    in_flight_counts,
    make_router,
    make_snap,
    prompt_ids,
    route_request,
)


def test_precise_index_follows_engine_snapshot_then_events():
    async def run():
        prompt = prompt_ids(16)
        hashes = hash_prompt_blocks(prompt, BS)
        # t2 already caches the prompt when the router starts (a restarted router): full snapshot.
        tt = [make_snap("t1", "tt", publishes=True), make_snap("t2", "tt", blocks=hashes, publishes=True)]
        router, handles = make_router(tt=tt, vllm=[])
        await router.refresh()
        assert handles["tt"].cursor_args[0] == {}  # no cursors yet: full snapshots
        assert router.logic.index.num_blocks("t2") == 4 and router.logic.index.num_blocks("t1") == 0
        assert (await router.choose(route_request("a", prompt))).replica_id == "t2"
        # Routing records the prompt on its replica speculatively (until a poll brings the
        # replica's KV events); the events confirm it.
        other = prompt_ids(12, seed=5)
        d = await router.choose(route_request("b", other))
        assert d.replica_id == "t1"  # t2 has "a" in flight
        assert router.logic.index.match(hash_prompt_blocks(other, BS), {"t1"}) == {"t1": 3}
        assert router.logic.index.num_speculative("t1") == 3
        tt[0].emit(BlockStored(tuple(hash_prompt_blocks(other, BS))))
        await router.refresh()
        assert handles["tt"].cursor_args[-1] == {
            "t1": KVCursor(tt[0].log.log_id, 0),
            "t2": KVCursor(tt[1].log.log_id, 0),
        }
        assert router.logic.index.num_blocks("t1") == 3 and router.logic.index.num_speculative("t1") == 0

    asyncio.run(run())


def test_replica_without_events_is_learned_from_routing_in_precise_mode():
    async def run():
        router, _ = make_router(tt=[], vllm=[make_snap("v1", "vllm"), make_snap("v2", "vllm")])
        await router.refresh()
        prompt = prompt_ids(12)
        d = await router.choose(route_request("a", prompt))
        assert router.logic.index.num_blocks(d.replica_id) == 3

    asyncio.run(run())


def test_lost_poll_rereads_from_the_same_cursor():
    async def run():
        t1 = make_snap("t1", "tt", publishes=True)
        router, handles = make_router(tt=[t1], vllm=[])
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
        assert router.logic.index.holds("t1", 11) and router.logic.index.holds("t1", 12)

    asyncio.run(run())


def test_restarted_engine_replica_and_overflowed_log_resync_from_snapshots():
    async def run():
        t1 = make_snap("t1", "tt", blocks=(1, 2), publishes=True)
        router, handles = make_router(tt=[t1], vllm=[])
        await router.refresh()
        assert router.logic.index.holds("t1", 1)
        # The engine replica restarts under the same id: a new log (and empty cache).
        reborn = make_snap("t1", "tt", blocks=(3,), publishes=True)
        handles["tt"].snapshots = [reborn]
        await router.refresh()
        assert not router.logic.index.holds("t1", 1) and router.logic.index.holds("t1", 3)
        # The router falls further behind than the log holds: a full snapshot again.
        # (70 events, a log of 64; the engine holds only the last 10 of them now.)
        reborn.emit(*(BlockStored((h,)) for h in range(100, 170)))
        reborn.blocks = [3] + list(range(160, 170))
        await router.refresh()
        assert router.logic.index.num_blocks("t1") == 11 and router.logic.index.holds("t1", 169)

    asyncio.run(run())


def test_an_answer_to_an_older_cursor_is_not_applied():
    async def run():
        t1 = make_snap("t1", "tt", publishes=True)
        router, _ = make_router(tt=[t1], vllm=[])
        await router.refresh()
        start = {"t1": t1.log.head}
        t1.emit(BlockStored((5,)))
        first = t1(start)  # two polls in flight from the same cursor (on-demand + periodic)
        t1.emit(BlockRemoved((5,)))
        second = t1(start)
        router.engines.apply_snapshot(second)
        router.engines.apply_snapshot(first)  # arrives late: must not store 5 again
        assert not router.logic.index.holds("t1", 5)

    asyncio.run(run())


def test_capacity_follows_the_engine_report():
    async def run():
        router, handles = make_router(tt=[make_snap("t1", "tt")], vllm=[])
        await router.refresh()
        assert router.logic.index.capacity("t1") == 64
        handles["tt"].snapshots = [lambda cursors: ReplicaSnapshot("t1", "tt", EngineStats(0, 0, 32, 8), 0, 2 * BS)]
        await router.refresh()
        assert router.logic.index.capacity("t1") == 64  # 32 engine blocks of 8 tokens = 64 routing blocks of 4
        handles["tt"].snapshots = [lambda cursors: ReplicaSnapshot("t1", "tt", EngineStats(0, 0, 10, 8), 0, BS)]
        await router.refresh()
        assert router.logic.index.capacity("t1") == 10

    asyncio.run(run())


def test_reported_dead_replica_is_dropped_at_once_and_readded_when_it_answers():
    async def run():
        t1 = make_snap("t1", "tt")
        t1_actor = "a1b2"
        handles_snaps = [lambda c: dataclasses.replace(t1(c), actor_id=t1_actor), make_snap("t2", "tt")]
        router, handles = make_router(tt=handles_snaps, vllm=[])
        await router.refresh()
        d = await router.choose(route_request("a", prompt_ids(8), session="s", pool="tt"))
        victim = d.replica_id
        # By actor id (exact), else by the replica id the decision named; no poll in between.
        if victim == "t1":
            await router.report_dead(None, t1_actor)
        else:
            await router.report_dead(victim)
        assert victim not in await in_flight_counts(router) and (await router.session_replica("s")) is None
        everyone = handles["tt"].snapshots
        handles["tt"].snapshots = [everyone[1] if victim == "t1" else everyone[0]]  # it stays silent
        for i in range(4):
            assert (await router.choose(route_request(f"b{i}", prompt_ids(8), session="s"))).replica_id != victim
        await router.report_dead("unknown-replica")  # harmless
        handles["tt"].snapshots = everyone  # (it was only unreachable)
        await router.refresh()  # a later poll that the replica answers: routed to again
        assert victim in await in_flight_counts(router)

    asyncio.run(run())


def test_poll_answers_sent_before_a_death_report_are_ignored():
    async def run():
        router, handles = make_router(tt=[make_snap("t1", "tt"), make_snap("t2", "tt")], vllm=[])
        await router.refresh()
        release = asyncio.Event()

        class SlowBroadcast(Broadcast):
            async def results_async(self, return_exceptions=False):
                await release.wait()
                return self._results

        handles["tt"].broadcast = lambda method, cursors=None: SlowBroadcast(
            [s(cursors or {}) for s in handles["tt"].snapshots]
        )
        poll = asyncio.ensure_future(router.refresh())
        await asyncio.sleep(0)
        await router.report_dead("t1")
        release.set()
        await poll  # its answer from t1 predates the report
        assert "t1" not in await in_flight_counts(router)

    asyncio.run(run())
