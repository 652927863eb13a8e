"""End to end on a real (small) Ray Serve: one TT engine replica with two lanes (tiny-llama, torch
mesh model, ``data_parallel_size: 2``), each lane its own prefix cache.

Chat sessions (``x-session-id``) in two groups sharing a system prompt send their turns
concurrently, in a different order every turn (a least-loaded lane pick would then move them
between lanes). Every turn after the first must be served from its own history: the engine's
``usage.prompt_tokens_details.cached_tokens`` covers every full block of the previous turn's
computed tokens (prompt + answer but its last token) — the lane coordinator keeps a session on
the lane that caches it.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.doubles.app_args import app_args, tt_pool
from tests.doubles.deployed_app import deployed_app

pytestmark = pytest.mark.slow

APP = "tt-lanes-e2e"
BLOCK_SIZE = 16
NUM_SESSIONS = 4
NUM_TURNS = 3
MAX_TOKENS = 6


def _args(tiny_llama) -> dict:
    pool = tt_pool(data_parallel_size=2, max_num_seqs=2, block_size=BLOCK_SIZE, enable_prefix_caching=True)
    return app_args("test_tt_lanes_e2e", tiny_llama, [pool])


@pytest.fixture(scope="module")
def base_url(serve_session, tiny_llama):
    with deployed_app(serve_session, APP, _args(tiny_llama), engine_replicas=1) as url:
        yield url


def _tokens(seed: int, n: int) -> list[int]:
    return [3 + (seed * 131 + i * 11) % 1000 for i in range(n)]


async def _turn(http: httpx.AsyncClient, base_url: str, session: str, prompt: list[int]) -> tuple[list[int], int]:
    r = await http.post(
        f"{base_url}/v1/completions",
        headers={"x-session-id": session},
        json={
            "model": "tiny-llama",
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    return body["choices"][0]["token_ids"], body["usage"]["prompt_tokens_details"]["cached_tokens"]


async def _conversations(base_url: str) -> dict[str, list[tuple[int, int, int]]]:
    """Per session, per turn: (prompt tokens, tokens of the previous turn's KV, cached tokens)."""
    system = {g: _tokens(900 + g, 3 * BLOCK_SIZE) for g in range(2)}
    history = {f"s{s}": system[s % 2] + _tokens(s, 20) for s in range(NUM_SESSIONS)}
    prev_computed = dict.fromkeys(history, 0)
    seen: dict[str, list[tuple[int, int, int]]] = {s: [] for s in history}
    sessions = list(history)
    async with httpx.AsyncClient(timeout=120) as http:
        for turn in range(NUM_TURNS):
            order = sessions[turn % NUM_SESSIONS :] + sessions[: turn % NUM_SESSIONS]
            tasks = {}
            for s in order:  # arrivals in this order, all concurrent
                tasks[s] = asyncio.create_task(_turn(http, base_url, s, history[s]))
                await asyncio.sleep(0.02)
            for s, task in tasks.items():
                answer, cached = await task
                seen[s].append((len(history[s]), prev_computed[s], cached))
                # the last answer token is sampled, never fed back: its KV is not computed
                prev_computed[s] = len(history[s]) + len(answer) - 1
                history[s] = history[s] + answer + _tokens(100 * turn + int(s[1:]), 12)
    return seen


def test_every_later_turn_hits_its_own_history_on_a_two_lane_replica(base_url):
    seen = asyncio.run(_conversations(base_url))
    print(f"(prompt, previous turn's KV tokens, cached) per session: {seen}")
    for session, turns in seen.items():
        for turn, (_, prev_kv, cached) in enumerate(turns[1:], start=1):
            assert cached == prev_kv // BLOCK_SIZE * BLOCK_SIZE, (session, turn, turns)
