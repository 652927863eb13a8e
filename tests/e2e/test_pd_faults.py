"""End to end on a real (small) Ray Serve with the REAL engines: the KV-connector actor's process
is killed (SIGKILL) while prefill/decode requests stream through it (issue 15, fault item 3).

A TT prefill pool (torch mesh model) and a vLLM-CPU decode pool; the actor is made before the
replicas with ``shm_max_payload_bytes=0``, so every hand-off goes through it (the object-store
path: the one a dead actor costs KV; shared-memory hand-offs survive it, see
tests/deployments/kv/test_connector_actor.py). Every request must complete greedy-exact against
HF transformers (a transfer lost with the actor is recomputed by the decode side), Ray must
restart the actor and later requests be disaggregated through it again, and nothing may leak:
no request left in an engine, every KV pool full again, no transfer left in the actor.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import pytest

from tests.doubles.app_args import app_args, tt_pool, vllm_pool
from tests.doubles.handle_loop import HANDLES, wait_until_router_knows
from tests.hf_reference import hf_greedy

pytestmark = pytest.mark.slow

APP = "pd-faults-e2e"
POOLS = {"prefill": "TTMeshReplica-tt-prefill", "decode": "VllmReplica-vllm-decode"}
MAX_TOKENS = 16
LEASE_S = 5.0


def _args(tiny_llama) -> dict:
    pools = [
        tt_pool("tt-prefill", role="prefill"),
        vllm_pool("vllm-decode", role="decode", enable_prefix_caching=True),
    ]
    return app_args("test_pd_faults_e2e", tiny_llama, pools, pd={"threshold_tokens": 64})


@pytest.fixture(scope="module")
def url(serve_session, tiny_llama):
    from ray import serve

    from deployments.kv.connector_actor import KVConnectorConfig, get_or_create_kv_connector, kill_kv_connector
    from serve_app.app import build_app

    # Before the replicas ask for it: every payload through the object store, short leases.
    get_or_create_kv_connector(APP, KVConnectorConfig(shm_max_payload_bytes=0, lease_s=LEASE_S))
    try:
        serve.run(build_app(_args(tiny_llama)), name=APP, route_prefix=f"/{APP}")
        wait_until_router_knows(APP, 2, timeout_s=120)
        yield f"{serve_session}/{APP}/v1/completions"
    finally:
        serve.delete(APP)
        kill_kv_connector(APP)


def _actor():
    from deployments.kv.connector_actor import get_kv_connector

    return get_kv_connector(APP)


def _actor_pid(timeout_s: float = 10) -> int:
    import ray

    return int(ray.get(_actor().handle.__ray_call__.remote(lambda self: os.getpid()), timeout=timeout_s))


def _prompt(n: int, seed: int) -> list[int]:
    return [3 + (seed * 31 + i * 17) % 1000 for i in range(n)]


def _body(prompt: list[int], stream: bool) -> dict:
    return {
        "model": "tiny-llama",
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": stream,
    }


async def _stream(http: httpx.AsyncClient, url: str, prompt: list[int], started: asyncio.Event) -> list[int]:
    tokens: list[int] = []
    async with http.stream("POST", url, json=_body(prompt, True)) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            for choice in event["choices"]:
                tokens.extend(choice.get("token_ids") or [])
            if tokens:
                started.set()
    return tokens


async def _engine_state(pool: str) -> list[tuple[int, int, int]]:
    """(requests inside generate(), running + waiting, KV blocks in use) per live replica."""
    from ray import serve

    handle = serve.get_deployment_handle(POOLS[pool], APP)
    answers = await handle.broadcast("routing_snapshot", {}).results_async(timeout_s=30)
    return [
        (
            a.num_inflight,
            a.stats.num_running + a.stats.num_waiting,
            a.stats.num_kv_blocks_total - a.stats.num_kv_blocks_free,
        )
        for a in answers
    ]


def _wait(condition, what: str, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = condition()
        except Exception as exc:  # the actor restarting: ask again
            value = exc
        if value and not isinstance(value, Exception):
            return value
        assert time.monotonic() < deadline, f"{what}: last {value!r}"
        time.sleep(0.25)


def test_pd_requests_survive_the_kv_connector_actor_killed_mid_traffic(url, tiny_llama):
    prompts = [_prompt(70 + 9 * i, 40 + i) for i in range(12)]  # all past the PD threshold
    with httpx.Client(timeout=120) as http:  # the object path works before the fault
        before = _actor().stats()["registry"]["num_completed"]
        warm = http.post(url, json=_body(prompts[0], False)).json()
        assert warm["choices"][0]["token_ids"] == hf_greedy(tiny_llama, prompts[0], MAX_TOKENS)
        assert _actor().stats()["registry"]["num_completed"] == before + 1
    old_pid = _actor_pid()

    async def traffic() -> list[list[int]]:
        async with httpx.AsyncClient(timeout=180) as http:
            started = asyncio.Event()
            first = [asyncio.ensure_future(_stream(http, url, p, started)) for p in prompts[:6]]
            await asyncio.wait_for(started.wait(), 120)  # hand-offs are under way
            os.kill(old_pid, signal.SIGKILL)
            # These arrive while the actor is dead or restarting.
            rest = [asyncio.ensure_future(_stream(http, url, p, asyncio.Event())) for p in prompts[6:]]
            return list(await asyncio.gather(*first, *rest))

    outputs = asyncio.run(traffic())
    for prompt, tokens in zip(prompts, outputs):
        assert tokens == hf_greedy(tiny_llama, prompt, MAX_TOKENS)

    # Ray restarted the actor (a new process under the same name) ...
    new_pid = _wait(lambda: (pid := _actor_pid()) != old_pid and pid, "the KV-connector actor restarted")
    assert new_pid != old_pid
    # ... and a later long prompt is disaggregated through it again.
    after = _prompt(90, 99)
    with httpx.Client(timeout=120) as http:
        out = http.post(url, json=_body(after, False)).json()
    assert out["choices"][0]["token_ids"] == hf_greedy(tiny_llama, after, MAX_TOKENS)
    _wait(lambda: _actor().stats()["registry"]["num_completed"] >= 1, "PD through the restarted actor")

    # Nothing leaked: no request in either engine, every KV pool full, no transfer held.
    def idle() -> bool:
        states = HANDLES.call(_engine_state("prefill")) + HANDLES.call(_engine_state("decode"))
        return len(states) == 2 and all(s == (0, 0, 0) for s in states)

    _wait(idle, "engines idle with every KV block free", timeout_s=30)
    _wait(
        lambda: (s := _actor().stats()["registry"])["num_transfers"] == 0 and s["num_bytes_used"] == 0,
        "no transfer left in the actor (leases expire)",
        timeout_s=4 * LEASE_S,
    )
