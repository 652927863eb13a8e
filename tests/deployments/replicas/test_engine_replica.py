"""The replica wrapper as a plain class around the HF test-double engine: streaming, abort on
early close (the caller went away), stats/snapshots, health, shutdown."""

from __future__ import annotations

import asyncio

import pytest

from accel.contract import FinishReason, GenerateRequest, SamplingParams
from deployments.config.load import load_app_config
from deployments.replicas.engine_replica import EngineReplica
from tests.doubles.hf_replay_engine import HFReplayEngine
from tests.hf_reference import hf_greedy


@pytest.fixture(scope="module")
def pool(tiny_llama):
    from pathlib import Path

    import yaml

    args = yaml.safe_load((Path(__file__).parents[3] / "configs/tiny.yaml").read_text())["applications"][0]["args"]
    return load_app_config(args).pools[0]


def _replica(pool, delay_s=0.0):
    return EngineReplica(
        pool, lambda p: HFReplayEngine(str(p.model_path), p.max_model_len, delay_s, block_size=p.block_size)
    )


def test_streams_greedy_tokens(pool, tiny_llama):
    async def run():
        replica = _replica(pool)
        req = GenerateRequest("r1", (0, 5, 6, 7), SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        deltas = [d async for d in replica.generate(req, replica_hint="ignored")]
        assert deltas[-1].finish_reason is FinishReason.LENGTH
        assert [t for d in deltas for t in d.new_token_ids] == hf_greedy(tiny_llama, [0, 5, 6, 7], 6)
        snap = replica.routing_snapshot()
        assert (snap.pool, snap.num_inflight, snap.stats.num_running) == ("tt", 0, 0)
        await replica.check_health()
        await replica.shutdown()
        with pytest.raises(RuntimeError):
            await replica.check_health()

    asyncio.run(run())


def test_early_close_aborts_the_engine_request(pool):
    async def run():
        replica = _replica(pool, delay_s=0.01)
        req = GenerateRequest("r2", (0, 5), SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
        gen = replica.generate(req)
        await gen.__anext__()
        assert replica.routing_snapshot().num_inflight == 1
        assert replica.stats().num_running == 1
        await gen.aclose()  # what Serve does when the caller cancels
        for _ in range(50):
            if replica.stats().num_running == 0:
                break
            await asyncio.sleep(0.01)
        assert replica.stats().num_running == 0
        assert replica.routing_snapshot().num_inflight == 0
        stats = replica.record_routing_stats()
        assert stats["num_running"] == 0 and stats["pool"] == "tt"

    asyncio.run(run())


def test_slow_consumer_gets_merged_deltas(pool, tiny_llama):
    async def run():
        replica = _replica(pool)
        req = GenerateRequest("r3", (0, 5, 6), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
        deltas = []
        async for d in replica.generate(req):
            deltas.append(d)
            await asyncio.sleep(0.05)  # the consumer lags behind the engine
        assert [t for d in deltas for t in d.new_token_ids] == hf_greedy(tiny_llama, [0, 5, 6], 12)
        assert len(deltas) < 12 and deltas[-1].finished

    asyncio.run(run())


def test_tt_replica_reports_block_snapshot_then_kv_events(pool):
    """The real TT engine (torch mesh model): a router without a cursor gets the full cached-block
    list; with one, the blocks stored since — and so does a second router from the same cursor
    (the log is read, not drained)."""
    from accel.block_hash import hash_prompt_blocks
    from deployments.messages.kv_events import BlockStored
    from deployments.replicas.tt_replica import TTMeshReplica

    async def generate(replica, rid, prompt):
        req = GenerateRequest(rid, prompt, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
        return [d async for d in replica.generate(req)]

    async def run():
        replica = TTMeshReplica(pool)
        try:
            bs = pool.block_size
            first_prompt, second_prompt = tuple(range(3, 3 + 2 * bs + 8)), tuple(range(500, 500 + 2 * bs + 8))
            await generate(replica, "a", first_prompt)
            snap = replica.routing_snapshot({})
            assert snap.publishes_kv_events and snap.block_size == bs and snap.kv_events == ()
            assert set(hash_prompt_blocks(first_prompt, bs)) <= set(snap.kv_blocks)
            assert snap.kv_cursor is not None and snap.actor_id is None  # (no Ray actor here)
            await generate(replica, "b", second_prompt)
            cursors = {replica.replica_id: snap.kv_cursor}
            synced = replica.routing_snapshot(cursors)
            assert synced.kv_blocks is None and synced.kv_from_seq == snap.kv_cursor.seq
            assert synced.kv_cursor.seq > snap.kv_cursor.seq
            stored = {h for e in synced.kv_events if isinstance(e, BlockStored) for h in e.block_hashes}
            assert set(hash_prompt_blocks(second_prompt, bs)) <= stored
            assert not set(hash_prompt_blocks(first_prompt, bs)) & stored  # already sent in the snapshot
            assert set(replica.kv_block_snapshot()) >= stored | set(snap.kv_blocks)
            # Another router at the same cursor (or this one after a lost answer): the same events.
            again = replica.routing_snapshot(cursors)
            assert (again.kv_events, again.kv_cursor) == (synced.kv_events, synced.kv_cursor)
            assert replica.routing_snapshot({replica.replica_id: synced.kv_cursor}).kv_events == ()
        finally:
            await replica.shutdown()

    asyncio.run(run())


def test_serve_stop_hook_shuts_the_engine_down_once(pool):
    """Serve calls ``__del__`` on stop and awaits the coroutine it returns; afterwards (the garbage
    collector's call) there is nothing left to await."""

    async def run():
        replica = _replica(pool)
        stop = replica.__del__()
        assert asyncio.iscoroutine(stop)
        await stop
        assert replica._engine.is_shut_down
        with pytest.raises(RuntimeError, match="shut down"):
            await replica.check_health()
        assert replica.__del__() is None

    asyncio.run(run())


def test_errors_leave_the_replica_plainly_picklable():
    """The ingress reads the token stream with plain pickle: an engine error must survive it."""
    import pickle

    from accel.contract import InvalidRequestError
    from deployments.replicas.engine_replica import plainly_picklable

    err = pickle.loads(pickle.dumps(plainly_picklable(InvalidRequestError("prompt", "too long"))))
    assert isinstance(err, InvalidRequestError) and (err.field, err.message) == ("prompt", "too long")
    dynamic = type("RayTaskError(ValueError)", (ValueError,), {})("actor failed")  # as Ray builds them
    safe = pickle.loads(pickle.dumps(plainly_picklable(dynamic)))
    assert isinstance(safe, RuntimeError) and "RayTaskError(ValueError): actor failed" in str(safe)


def test_busy_replica_coalesces_streams_exactly_and_sends_first_tokens_at_once(pool, tiny_llama):
    """Two streams on one replica with an hour-long window: each stream's first message is its
    first token alone, the rest arrives merged (far fewer messages than tokens), and the merged
    token ids, text, logprobs and finish reason are exactly the unmerged stream's."""
    import dataclasses

    async def collect(replica, rid, prompt, n):
        sampling = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=0)
        return [d async for d in replica.generate(GenerateRequest(rid, prompt, sampling))]

    async def run():
        lone = await collect(_replica(pool), "lone", (0, 5, 6), 10)
        busy = _replica(dataclasses.replace(pool, stream_interval_s=3600.0))
        a, b = await asyncio.gather(collect(busy, "a", (0, 5, 6), 10), collect(busy, "b", (0, 7, 8), 10))
        for msgs, prompt in ((a, [0, 5, 6]), (b, [0, 7, 8])):
            assert len(msgs[0].new_token_ids) == 1  # the first token was not held
            assert [t for d in msgs for t in d.new_token_ids] == hf_greedy(tiny_llama, prompt, 10)
            assert len(msgs) < 10 and msgs[-1].finish_reason is FinishReason.LENGTH
            assert msgs[-1].num_completion_tokens == 10
            assert [lp.token_id for d in msgs for lp in d.logprobs] == [t for d in msgs for t in d.new_token_ids]
        assert "".join(d.text for d in a) == "".join(d.text for d in lone)
        assert [lp.logprob for d in a for lp in d.logprobs] == [lp.logprob for d in lone for lp in d.logprobs]

    asyncio.run(run())


def test_a_stalled_engine_fails_the_health_check_and_every_inflight_stream(pool):
    """No output for ``step_timeout_s`` with requests in flight: the check raises (Serve then
    restarts the replica) after ending each open stream with the error; nothing stays in flight."""
    import dataclasses

    async def run():
        replica = _replica(dataclasses.replace(pool, step_timeout_s=0.3), delay_s=30.0)  # 30 s per token: stalled
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)

        async def client(i):
            with pytest.raises(RuntimeError, match="unhealthy: no engine output"):
                async for _ in replica.generate(GenerateRequest(f"s{i}", (0, 5, i), params)):
                    pass

        clients = [asyncio.create_task(client(i)) for i in range(2)]
        await asyncio.sleep(0.05)
        await replica.check_health()  # in flight, but not stalled yet
        await asyncio.sleep(0.4)
        with pytest.raises(RuntimeError, match=r"2 request\(s\) are in flight"):
            await replica.check_health()
        await asyncio.wait_for(asyncio.gather(*clients), timeout=5)
        assert replica.routing_snapshot().num_inflight == 0
        await replica.check_health()  # idle again: no stall
        await replica.shutdown()

    asyncio.run(run())
