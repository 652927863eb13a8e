"""End to end on a real (small) Ray Serve: TWO router replicas (and two ingress replicas) in front
of two TT engine replicas (tiny-llama, torch mesh model, one lane each).

- Every session is decided by one router replica (rendezvous hashing on the router handles of
  both ingress replicas), so its binding lives there only and each multi-turn conversation stays
  on one engine replica: its KV blocks are on exactly one engine.
- After traffic quiesces, both router replicas hold the same precise prefix index — the engines'
  own cached blocks — because each follows every engine's KV event log from its own cursor.
"""

from __future__ import annotations

import time

import httpx
import pytest

from accel.block_hash import hash_prompt_blocks
from deployments.config.router import RouterConfig
from deployments.handle_routing.rendezvous import rendezvous_order
from deployments.messages.routing import RouteRequest
from tests.doubles.app_args import app_args, tt_pool
from tests.doubles.deployed_app import deployed_app
from tests.doubles.handle_loop import HANDLES
from tests.doubles.session_turns import session_turn, user_tokens

pytestmark = pytest.mark.slow

APP = "router-replicas-e2e"
POOL = "TTMeshReplica-tt"
ROUTER = "Router"
BLOCK_SIZE = 16
NUM_TURNS = 4
STATS_PERIOD_S = 0.25


def _args(tiny_llama) -> dict:
    pool = tt_pool(replicas=2, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    router = {"index_mode": "precise", "stats_period_s": STATS_PERIOD_S, "replicas": 2}
    return app_args("test_router_replicas_e2e", tiny_llama, [pool], router=router, ingress={"replicas": 2})


async def _broadcast(deployment: str, method: str, *args):
    from ray import serve

    return await serve.get_deployment_handle(deployment, APP).broadcast(method, *args).results_async(timeout_s=30)


def _call(deployment: str, method: str, *args):
    return HANDLES.call(_broadcast(deployment, method, *args))


def _sessions_split_over(router_ids: list[str], per_router: int) -> dict[str, str]:
    """Session names, ``per_router`` owned by each router replica (session -> owner)."""
    owned: dict[str, str] = {}
    counts = {r: 0 for r in router_ids}
    i = 0
    while min(counts.values()) < per_router:
        name = f"chat-{i}"
        owner = rendezvous_order(RouteRequest("x", "tiny-llama", 0, session_id=name).affinity_key, router_ids)[0]
        if counts[owner] < per_router:
            owned[name] = owner
            counts[owner] += 1
        i += 1
    return owned


@pytest.fixture(scope="module")
def app_url(serve_session, tiny_llama):
    with deployed_app(serve_session, APP, _args(tiny_llama), engine_replicas=2) as url:
        deadline = time.monotonic() + 60  # (that reached one router replica; wait for both)
        while sorted(len(s.replicas) for s in _call(ROUTER, "snapshot")) != [2, 2]:
            assert time.monotonic() < deadline, "a router replica never saw both engine replicas"
            time.sleep(0.2)
        yield url


def test_router_replicas_agree_and_conversations_stay_put(app_url):
    snapshots = _call(ROUTER, "snapshot")
    router_ids = sorted(s.router_replica_id for s in snapshots)
    assert len(set(router_ids)) == 2
    # Each router replica hears the other's in-flight counts (the peer load broadcast).
    deadline = time.monotonic() + 30
    while not all(s.peer_router_ids == tuple(r for r in router_ids if r != s.router_replica_id) for s in snapshots):
        assert time.monotonic() < deadline, [s.peer_router_ids for s in snapshots]
        time.sleep(0.2)
        snapshots = _call(ROUTER, "snapshot")
    owners = _sessions_split_over(router_ids, per_router=2)
    histories = {s: user_tokens(c, 0, 40) for c, s in enumerate(owners)}
    with httpx.Client(timeout=120) as http:
        for turn in range(NUM_TURNS):
            for c, session in enumerate(owners):  # turns interleaved; the proxy spreads the ingresses
                answer = session_turn(http, app_url, session, histories[session])
                histories[session] += answer + user_tokens(c, turn + 1, 20)

    # Each session is bound on the router replica that owns its key, and only there. (Broadcast
    # results come in the handle's replica order; the two calls around check it did not change.)
    order = [s.router_replica_id for s in _call(ROUTER, "snapshot")]
    bindings = {session: dict(zip(order, _call(ROUTER, "session_replica", session))) for session in owners}
    assert [s.router_replica_id for s in _call(ROUTER, "snapshot")] == order
    for session, owner in owners.items():
        bound = bindings[session]
        assert bound[owner] is not None and all(b is None for r, b in bound.items() if r != owner), bound

    # Each conversation's KV blocks are on exactly one engine replica (it never moved).
    engine_blocks = {s.replica_id: set(s.kv_blocks) for s in _call(POOL, "routing_snapshot", {})}
    for session, history in histories.items():
        prompt_blocks = set(hash_prompt_blocks(history[:-20], BLOCK_SIZE))  # the last prompt's full blocks
        holders = [len(blocks & prompt_blocks) for blocks in engine_blocks.values()]
        assert sorted(holders) == [0, len(prompt_blocks)], (session, holders)

    # Quiesced: both router replicas' precise indexes equal each other and the engines' caches
    # (after a few polls, and after the speculative entries of the last dispatches expired: each
    # router records only its own dispatches there).
    time.sleep(4 * STATS_PERIOD_S + RouterConfig().speculative_ttl_s)
    engine_blocks = {s.replica_id: set(s.kv_blocks) for s in _call(POOL, "routing_snapshot", {})}
    probe = sorted(
        set().union(*engine_blocks.values())
        | {h for hist in histories.values() for h in hash_prompt_blocks(hist, BLOCK_SIZE)}
    )
    views = _call(ROUTER, "prefix_index_view", probe)
    assert len(views) == 2 and views[0].replicas == views[1].replicas, views
    truth = tuple(
        (rid, tuple(h for h in probe if h in blocks), len(blocks)) for rid, blocks in sorted(engine_blocks.items())
    )
    assert views[0].replicas == truth
