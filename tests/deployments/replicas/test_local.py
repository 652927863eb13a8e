"""A pool's engine inside the calling process (``placement: ingress``): the real TT engine (torch
mesh model on CPU) behind ``LocalPoolClient``, called as the ingress calls a pool."""

from __future__ import annotations

import asyncio

import pytest

from accel.contract import FinishReason, GenerateRequest, SamplingParams
from deployments.config.load import load_app_config
from deployments.replicas.local import LocalPoolClient, make_replica
from deployments.replicas.tt_replica import TTMeshReplica
from tests.doubles.app_args import app_args, tt_pool
from tests.hf_reference import hf_greedy


@pytest.fixture(scope="module")
def pool(tiny_llama):
    args = app_args("local-test.yaml", tiny_llama, [dict(tt_pool(), placement="ingress")])
    (pool,) = load_app_config(args).pools
    return pool


def test_streams_hf_greedy_tokens_from_the_engine_in_this_process(pool, tiny_llama):
    async def run():
        client = LocalPoolClient(make_replica(pool))
        assert isinstance(client.replica, TTMeshReplica)
        (replica_id,) = client.running_replicas()
        assert replica_id == client.replica.replica_id
        req = GenerateRequest("r1", (0, 5, 6, 7), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        deltas = [d async for d in client.generate(req, replica_id)]
        assert deltas[-1].finish_reason is FinishReason.LENGTH
        assert [t for d in deltas for t in d.new_token_ids] == hf_greedy(tiny_llama, [0, 5, 6, 7], 8)
        await client.check_health()
        await client.shutdown()
        assert client.running_replicas() == frozenset()  # /health and /v1/models stop listing it
        with pytest.raises(RuntimeError, match="shut down"):
            await client.check_health()

    asyncio.run(run())


def test_cancel_aborts_the_engine_request_and_frees_its_kv_blocks(pool):
    """What the ingress does when the client goes away mid-stream (``EngineClient._replica_stream``
    cancels the stream it stopped reading)."""

    async def run():
        client = LocalPoolClient(make_replica(pool))
        free_before = client.replica.stats().num_kv_blocks_free
        req = GenerateRequest("r2", tuple(range(40)), SamplingParams(temperature=0, max_tokens=470, ignore_eos=True))
        stream = client.generate(req, None)
        deltas = aiter(stream)
        await anext(deltas)
        await anext(deltas)
        stats = client.replica.stats()
        assert stats.num_running == 1 and stats.num_kv_blocks_free < free_before
        stream.cancel()
        for _ in range(50):  # (the 470 tokens take seconds; an abort, milliseconds)
            stats = client.replica.stats()
            if stats.num_running == 0 and stats.num_kv_blocks_free == free_before:
                break
            await asyncio.sleep(0.01)
        assert (stats.num_running, stats.num_kv_blocks_free) == (0, free_before)
        assert client.replica.routing_snapshot().num_inflight == 0
        stream.cancel()  # again, after the end: nothing happens
        await client.shutdown()

    asyncio.run(run())


def test_kv_events_nobody_polls_do_not_pile_up_in_the_engine(pool):
    """No router polls an engine inside the ingress: each finished request drains the engine's
    KV events instead of leaving them to grow for ever."""

    async def run():
        client = LocalPoolClient(make_replica(pool))
        for i in range(3):
            req = GenerateRequest(f"k{i}", tuple(range(i, 40 + i)), SamplingParams(temperature=0, max_tokens=4))
            assert [d async for d in client.generate(req, None)][-1].finished
        assert client.replica._engine.take_kv_events() == []
        await client.shutdown()

    asyncio.run(run())
