"""End to end on a real (small) Ray Serve: the router deployment (RouterLogic) in front of two TT
engine replicas (tiny-llama, torch mesh model, one lane each so a replica is one prefix cache).

- A multi-turn conversation (growing history, one ``x-session-id``) stays on one replica: the
  router keeps its session binding, and only one engine holds the conversation's KV blocks.
- The same chat script gets more engine prefix-cache hits (the engines' own counters) under the
  default ``prefix+session+load`` policy than under ``round_robin``.
"""

from __future__ import annotations

import httpx
import pytest

from accel.block_hash import hash_prompt_blocks
from tests.doubles.app_args import app_args, tt_pool
from tests.doubles.handle_loop import HANDLES, HandleLoop, wait_until_router_knows
from tests.doubles.session_turns import session_turn, user_tokens

pytestmark = pytest.mark.slow

POOL = "TTMeshReplica-tt"
ROUTER = "Router"
BLOCK_SIZE = 16
NUM_CONVERSATIONS = 3  # odd, so round-robin moves every conversation between the two replicas
NUM_TURNS = 5


def _args(tiny_llama, policy: str) -> dict:
    pool = tt_pool(replicas=2, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    router = {"policy": policy, "index_mode": "precise", "stats_period_s": 0.25}
    return app_args(f"test_router_e2e[{policy}]", tiny_llama, [pool], router=router)


class _App:
    def __init__(self, name: str, base_url: str, handles: HandleLoop):
        self.name, self.base_url, self._handles = name, base_url, handles

    async def _broadcast(self, method: str):
        from ray import serve

        return await serve.get_deployment_handle(POOL, self.name).broadcast(method).results_async(timeout_s=30)

    async def _session_replica(self, key: str):
        from ray import serve

        return await serve.get_deployment_handle(ROUTER, self.name).session_replica.remote(key)

    def prefix_cache_hits(self) -> int:
        return sum(s.prefix_cache_hits for s in self._handles.call(self._broadcast("stats")))

    def cached_blocks_per_replica(self) -> list[set[int]]:
        return [set(blocks) for blocks in self._handles.call(self._broadcast("kv_block_snapshot"))]

    def session_replica(self, key: str) -> str | None:
        return self._handles.call(self._session_replica(key))


@pytest.fixture(scope="module")
def handles() -> HandleLoop:
    return HANDLES


def _deploy(serve_session, tiny_llama, handles, policy: str):
    from ray import serve

    from serve_app.app import build_app

    name = f"router-e2e-{policy.replace('+', '-')}"
    serve.run(build_app(_args(tiny_llama, policy)), name=name, route_prefix=f"/{name}")
    app = _App(name, f"{serve_session}/{name}", handles)
    wait_until_router_knows(name, 2)
    return app


def _run_script(app: _App) -> dict[str, set[str | None]]:
    """NUM_CONVERSATIONS chats, turns interleaved; each turn's prompt = the whole history so far
    (previous prompts and answers) plus a new user message. Returns session -> bound replicas."""
    histories = {f"chat-{c}": user_tokens(c, 0, 40) for c in range(NUM_CONVERSATIONS)}
    bound: dict[str, set[str | None]] = {s: set() for s in histories}
    with httpx.Client(timeout=120) as http:
        for turn in range(NUM_TURNS):
            for c, session in enumerate(histories):
                answer = session_turn(http, app.base_url, session, histories[session])
                bound[session].add(app.session_replica(session))
                histories[session] = histories[session] + answer + user_tokens(c, turn + 1, 20)
    return bound


def test_sessions_stick_and_prefix_hits_beat_round_robin(serve_session, tiny_llama, handles):
    from ray import serve

    hits = {}
    for policy in ("round_robin", "prefix+session+load"):
        app = _deploy(serve_session, tiny_llama, handles, policy)
        try:
            before = app.prefix_cache_hits()
            bound = _run_script(app)
            hits[policy] = app.prefix_cache_hits() - before
            if policy == "prefix+session+load":
                assert all(len(replicas) == 1 and None not in replicas for replicas in bound.values()), bound
                # One more conversation alone: its KV blocks live on exactly one engine.
                history = user_tokens(7, 0, 40)
                with httpx.Client(timeout=120) as http:
                    for turn in range(4):
                        answer = session_turn(http, app.base_url, "solo", history)
                        history = history + answer + user_tokens(7, turn + 1, 20)
                solo = set(hash_prompt_blocks(history[:-26], BLOCK_SIZE))  # the last prompt's full blocks
                holders = [blocks & solo for blocks in app.cached_blocks_per_replica()]
                assert sorted(len(h) for h in holders) == [0, len(solo)], holders
        finally:
            serve.delete(app.name)
    print(f"engine prefix-cache hit tokens by policy: {hits}")
    assert hits["prefix+session+load"] > hits["round_robin"] > 0, hits
