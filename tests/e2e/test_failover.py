"""End to end on a real (small) Ray Serve with the REAL engines: an engine replica killed while it
streams; the client's stream continues on the other replica of its pool without a seam (issue 15).

Greedy output equals the uninterrupted run token for token on both engine kinds, usage counts the
original prompt once; seeded sampling on the TT engine continues exactly (its generator is seeded
by (seed, position)). One app for the module: two TT-mesh replicas and two vLLM-CPU replicas.
"""

from __future__ import annotations

import json
import time

import openai
import pytest

from tests.doubles import replica_kill
from tests.doubles.app_args import app_args, tt_pool, vllm_pool
from tests.doubles.deployed_app import deployed_app
from tests.doubles.handle_loop import HANDLES

pytestmark = pytest.mark.slow

APP = "failover-e2e"
POOLS = {"tt": "TTMeshReplica-tt", "vllm": "VllmReplica-vllm"}
PROMPT_IDS = [0, 17, 250, 33, 400, 5, 91]
MAX_TOKENS = 300


def _args(tiny_llama) -> dict:
    pools = [tt_pool(replicas=2, block_size=32), vllm_pool(replicas=2)]
    return app_args("test_failover_e2e", tiny_llama, pools, router={"stats_period_s": 0.5})


@pytest.fixture(scope="module")
def app_url(serve_session, tiny_llama):
    with deployed_app(serve_session, APP, _args(tiny_llama), engine_replicas=4, timeout_s=120) as url:
        yield url


@pytest.fixture(scope="module")
def client(app_url):
    return openai.OpenAI(base_url=f"{app_url}/v1", api_key="unused", max_retries=0, timeout=120)


def kill_busy_replica(pool: str) -> str:
    return replica_kill.kill_busy_replica(APP, POOLS[pool])


def _wait_pool_size(pool: str, n: int, timeout_s: float = 120) -> None:
    replica_kill.wait_pool_size(APP, POOLS[pool], n, timeout_s)


def _kw(pool: str, **sampling) -> dict:
    return dict(
        model="tiny-llama",
        prompt=PROMPT_IDS,
        max_tokens=MAX_TOKENS,
        extra_headers={"x-meshserve-pool": pool},
        extra_body={"ignore_eos": True, "return_token_ids": True},
        **sampling,
    )


def _stream_with_a_kill(client, pool: str, **sampling) -> tuple[list[int], str, object]:
    tokens: list[int] = []
    text, usage, killed = "", None, False
    stream = client.completions.create(stream=True, stream_options={"include_usage": True}, **_kw(pool, **sampling))
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            tokens.extend(choice.model_extra.get("token_ids") or [])
            text += choice.text
        if tokens and not killed:
            kill_busy_replica(pool)
            killed = True
    assert killed
    return tokens, text, usage


@pytest.mark.parametrize("pool", ["tt", "vllm"])
def test_greedy_stream_survives_its_replica_token_exact(client, app_url, pool):
    reference = client.completions.create(temperature=0, **_kw(pool)).choices[0]
    before = replica_kill.stream_failovers(app_url, "tiny-llama")
    tokens, text, usage = _stream_with_a_kill(client, pool, temperature=0)
    assert replica_kill.stream_failovers(app_url, "tiny-llama") == before + 1  # it did fail over, once
    assert tokens == reference.model_extra["token_ids"] and len(tokens) == MAX_TOKENS
    assert text == reference.text
    assert usage.prompt_tokens == len(PROMPT_IDS) and usage.completion_tokens == MAX_TOKENS
    _wait_pool_size(pool, 2)  # Serve replaces the dead replica


def test_seeded_stream_continues_exactly_on_tt(client, app_url):
    sampling = dict(temperature=1.0, seed=1234)
    reference = client.completions.create(**_kw("tt"), **sampling).choices[0].model_extra["token_ids"]
    before = replica_kill.stream_failovers(app_url, "tiny-llama")
    tokens, _, usage = _stream_with_a_kill(client, "tt", **sampling)
    assert replica_kill.stream_failovers(app_url, "tiny-llama") == before + 1
    assert tokens == reference and usage.completion_tokens == MAX_TOKENS
    _wait_pool_size("tt", 2)


# A schema whose one string is long, so the stream is still running when its replica is killed.
LONG_JSON_SCHEMA = {
    "type": "object",
    "properties": {"note": {"type": "string", "minLength": 120, "maxLength": 120}},
    "required": ["note"],
    "additionalProperties": False,
}


def test_json_schema_stream_resumes_its_grammar_on_tt(client, app_url):
    """A structured-output stream that fails over continues its grammar where it stopped (the
    continuation carries the tokens sent as resumed output): the text parses, validates and equals
    the uninterrupted run."""
    import jsonschema

    response_format = {"type": "json_schema", "json_schema": {"name": "note", "schema": LONG_JSON_SCHEMA}}
    kw = dict(
        model="tiny-llama",
        messages=[{"role": "user", "content": "Write a note."}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        response_format=response_format,
        extra_headers={"x-meshserve-pool": "tt"},
    )
    reference = client.chat.completions.create(**kw).choices[0].message.content
    before = replica_kill.stream_failovers(app_url, "tiny-llama")
    text, killed = "", False
    for chunk in client.chat.completions.create(stream=True, **kw):
        for choice in chunk.choices:
            text += choice.delta.content or ""
        if text and not killed:
            kill_busy_replica("tt")
            killed = True
    assert killed and replica_kill.stream_failovers(app_url, "tiny-llama") == before + 1
    assert text == reference
    jsonschema.validate(json.loads(text), LONG_JSON_SCHEMA)
    _wait_pool_size("tt", 2)


async def _engine_state(pool: str) -> list[tuple[int, int, int]]:
    """(requests inside generate(), running + waiting, KV blocks in use) per live replica."""
    from ray import serve

    handle = serve.get_deployment_handle(POOLS[pool], APP)
    answers = await handle.broadcast("routing_snapshot", {}).results_async(return_exceptions=True)
    return [
        (
            a.num_inflight,
            a.stats.num_running + a.stats.num_waiting,
            a.stats.num_kv_blocks_total - a.stats.num_kv_blocks_free,
        )
        for a in answers
        if not isinstance(a, BaseException)
    ]


def test_client_disconnects_leave_no_request_and_no_kv_block(client, serve_session):
    """30 % of the clients go away mid-stream: afterwards no request is left in any replica and the
    TT engines' KV pools are full again (vLLM's own stats refresh only on its next step, so its
    replicas are checked by the requests inside generate())."""
    import asyncio
    import random

    import httpx

    rng = random.Random(7)
    url = f"{serve_session}/{APP}/v1/completions"

    async def one(i: int) -> str:
        pool = "tt" if i % 2 == 0 else "vllm"
        prompt = [1] + [rng.randrange(3, 1000) for _ in range(rng.randrange(4, 30))]
        leave = rng.randrange(2, 5) if rng.random() < 0.3 else None
        body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": 24, "ignore_eos": True, "stream": True}
        async with httpx.AsyncClient(timeout=120) as http:
            async with http.stream("POST", url, json=body, headers={"x-meshserve-pool": pool}) as r:
                assert r.status_code == 200
                n = 0
                async for line in r.aiter_lines():
                    n += line.startswith("data: ")
                    if leave is not None and n >= leave:
                        return "left"
        return "done"

    async def soak() -> list[str]:
        sem = asyncio.Semaphore(8)

        async def bounded(i: int) -> str:
            async with sem:
                return await one(i)

        return await asyncio.gather(*(bounded(i) for i in range(60)))

    outcomes = asyncio.run(soak())
    assert 0 < outcomes.count("left") < 60
    deadline = time.monotonic() + 30
    while True:
        tt = HANDLES.call(_engine_state("tt"))
        vllm = HANDLES.call(_engine_state("vllm"))
        # (non-empty: a broadcast that reached no replica proves nothing)
        clean = bool(tt and vllm) and all(s == (0, 0, 0) for s in tt) and all(s[0] == 0 for s in vllm)
        if clean or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert clean, (tt, vllm)


def test_requests_are_answered_while_the_router_is_dead(client):
    """Fault item 2: the router replica killed (Serve replaces it), then requests on both pools at
    once: the ingress decides locally while the router is gone, every request is answered in full,
    and the replaced router answers again. Last in the module: the router is replaced under it."""
    import asyncio

    import ray
    from ray import serve

    from serve_app.app import ROUTER_NAME

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if f"{APP}#{ROUTER_NAME}#" in a["name"]]
    assert names, "no router replica found"
    for name in names:
        ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)

    async def ask(i: int):
        pool = "tt" if i % 2 == 0 else "vllm"
        return await asyncio.to_thread(
            client.completions.create, temperature=0, **{**_kw(pool), "max_tokens": 16, "prompt": PROMPT_IDS[i:]}
        )

    async def all_of_them():
        return await asyncio.gather(*(ask(i) for i in range(6)))

    for answer in asyncio.run(all_of_them()):
        assert answer.usage.completion_tokens == 16 and len(answer.choices[0].model_extra["token_ids"]) == 16

    async def router_answers() -> bool:
        try:
            await serve.get_deployment_handle(ROUTER_NAME, APP).snapshot.remote()
            return True
        except Exception:
            return False

    deadline = time.monotonic() + 120
    while not HANDLES.call(router_answers()):
        assert time.monotonic() < deadline, "the router was never replaced"
        time.sleep(0.5)
