"""End to end on a real (small) Ray Serve: the router inside the ingress (``router.placement:
ingress``) in front of two TT engine replicas (tiny-llama, torch mesh model, one lane each).

- No router deployment runs; the ingress decides in-process, from its own polls of the engines
  and their KV events (precise index), shows the decisions on ``GET /metrics`` and its router's
  snapshot over its Serve handle (``router_snapshot``), every ticket released.
- Multi-turn conversations (one ``x-session-id`` each, turns interleaved) stay on one engine
  replica: each conversation's KV blocks are on exactly one engine.
"""

from __future__ import annotations

import re

import httpx
import pytest

from accel.block_hash import hash_prompt_blocks
from tests.doubles.app_args import app_args, tt_pool
from tests.doubles.deployed_app import deployed_app
from tests.doubles.handle_loop import HANDLES
from tests.doubles.session_turns import session_turn, user_tokens

pytestmark = pytest.mark.slow

APP = "router-in-ingress-e2e"
POOL = "TTMeshReplica-tt"
BLOCK_SIZE = 16
NUM_CONVERSATIONS = 3
NUM_TURNS = 4
DECISIONS = re.compile(r'^meshserve:router_decisions_total\{[^}]*reason="([^"]+)"[^}]*\}\s+([0-9.eE+-]+)$', re.M)


def _args(tiny_llama) -> dict:
    pool = tt_pool(replicas=2, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    router = {"placement": "ingress", "index_mode": "precise", "stats_period_s": 0.25}
    return app_args("test_router_in_ingress_e2e", tiny_llama, [pool], router=router)


async def _router_snapshot():
    from ray import serve

    from serve_app.app import INGRESS_NAME

    return await serve.get_deployment_handle(INGRESS_NAME, APP).router_snapshot.remote()


async def _routing_snapshots():
    from ray import serve

    return await serve.get_deployment_handle(POOL, APP).broadcast("routing_snapshot", {}).results_async(timeout_s=30)


def test_the_ingress_routes_sessions_itself_without_a_router_deployment(serve_session, tiny_llama):
    from ray import serve

    with deployed_app(serve_session, APP, _args(tiny_llama)) as url:
        deployments = set(serve.status().applications[APP].deployments)
        assert "Router" not in deployments and POOL in deployments, deployments
        histories = {f"chat-{c}": user_tokens(c, 0, 40) for c in range(NUM_CONVERSATIONS)}
        with httpx.Client(timeout=120) as http:
            for turn in range(NUM_TURNS):
                for c, session in enumerate(histories):
                    answer = session_turn(http, url, session, histories[session])
                    histories[session] += answer + user_tokens(c, turn + 1, 20)
            metrics = http.get(f"{url}/metrics").text

        decisions: dict[str, float] = {}
        for reason, value in DECISIONS.findall(metrics):
            decisions[reason] = decisions.get(reason, 0.0) + float(value)
        # Every request was decided here (no fallback, no pool-only decision): the first turn of
        # each conversation by cost, the later ones by its session.
        assert sum(decisions.values()) == NUM_CONVERSATIONS * NUM_TURNS, decisions
        assert decisions.get("session", 0) >= NUM_CONVERSATIONS * (NUM_TURNS - 1) - 1, decisions
        assert "no_replica_known" not in decisions, decisions

        # The ingress's router sees both engine replicas, and every ticket came back (released).
        snapshot = HANDLES.call(_router_snapshot())
        assert len(snapshot.replicas) == 2 and snapshot.num_open_tickets == 0, snapshot
        assert all(view.load.num_in_flight == 0 for view in snapshot.replicas), snapshot

        engine_blocks = {s.replica_id: set(s.kv_blocks) for s in HANDLES.call(_routing_snapshots())}
        assert len(engine_blocks) == 2
        for session, history in histories.items():
            prompt_blocks = set(hash_prompt_blocks(history[:-20], BLOCK_SIZE))  # the last prompt's full blocks
            holders = [len(blocks & prompt_blocks) for blocks in engine_blocks.values()]
            assert sorted(holders) == [0, len(prompt_blocks)], (session, holders)
