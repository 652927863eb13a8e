"""End to end: the ingress's concurrency bound answers 429 with ``Retry-After``, and a client that
goes away (mid-stream or before a non-streaming answer) aborts its engine request."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.doubles.app_args import pin
from tests.doubles.handle_loop import HANDLES
from tests.e2e.openai_api.local_app import APP, MAX_CONCURRENT, POOLS, PROMPT_IDS

pytestmark = pytest.mark.slow


async def _running_on_handle_loop(pool: str) -> int:
    from ray import serve

    handle = serve.get_deployment_handle(POOLS[pool], APP)
    return sum(s.num_running + s.num_waiting for s in await handle.broadcast("stats").results_async(timeout_s=30))


def _engine_running(pool: str) -> int:
    return HANDLES.submit(_running_on_handle_loop(pool)).result(timeout=60)


async def _engine_running_async(pool: str) -> int:
    return await asyncio.wrap_future(HANDLES.submit(_running_on_handle_loop(pool)))


def test_full_ingress_answers_429_with_retry_after(base_url):
    body = {
        "model": "tiny-llama",
        "prompt": PROMPT_IDS,
        "max_tokens": 400,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }

    async def run():
        async with httpx.AsyncClient(timeout=60) as http:

            async def one():
                req = http.build_request("POST", f"{base_url}/v1/completions", json=body)
                resp = await http.send(req, stream=True)
                return resp

            responses = await asyncio.gather(*[one() for _ in range(MAX_CONCURRENT + 4)])
            statuses = sorted(r.status_code for r in responses)
            rejected = [r for r in responses if r.status_code == 429]
            for r in rejected:
                await r.aread()
            details = [(r.headers.get("retry-after"), r.json()["error"]["type"]) for r in rejected]
            for r in responses:
                await r.aclose()
            return statuses, details

    statuses, details = asyncio.run(run())
    assert statuses.count(200) >= 1 and statuses.count(429) >= 4, statuses
    assert set(statuses) <= {200, 429}
    assert all(retry == "1" and kind == "RateLimitError" for retry, kind in details)
    _wait_idle()


def _wait_idle(timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(_engine_running(p) == 0 for p in POOLS):
            return
        time.sleep(0.2)
    raise AssertionError({p: _engine_running(p) for p in POOLS})


@pytest.mark.parametrize("pool", ["tt", "vllm"])
@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_aborts_engine_request(base_url, pool, stream):
    _wait_idle()
    body = {"model": "tiny-llama", "prompt": PROMPT_IDS, "max_tokens": 480, "ignore_eos": True, "stream": stream}

    async def run():
        async with httpx.AsyncClient(timeout=60) as http:
            req = http.build_request("POST", f"{base_url}/v1/completions", json=body, headers=pin(pool))
            if stream:
                resp = await http.send(req, stream=True)
                lines = resp.aiter_lines()
                await lines.__anext__()
                busy = await _engine_running_async(pool)
                await resp.aclose()  # the client goes away mid-stream
                return busy
            task = asyncio.ensure_future(http.send(req))
            for _ in range(100):
                await asyncio.sleep(0.05)
                busy = await _engine_running_async(pool)
                if busy:
                    break
            task.cancel()  # the client goes away before the (non-streaming) answer
            await asyncio.gather(task, return_exceptions=True)
            return busy

    busy = asyncio.run(run())
    assert busy >= 1
    _wait_idle(timeout_s=15)
