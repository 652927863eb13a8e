"""The first token is never held between the engine and the HTTP body (issue 42): the whole
in-process path of a pool placed in the ingress (``EngineReplica`` with its ``DeltaCoalescer``
on a busy replica with an hour-long window, ``LocalPoolClient``, ``EngineClient.stream``,
``merge_streams``, the pipeline's first-delta peek, the SSE render and the admission wrapper)
yields the first token's SSE chunk while the engine still holds every later token. Order of
events, not timing: the engine is gated, and the chunk must come out before the gate opens."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request

from accel.contract import EngineStats, FinishReason, GenerateRequest, OutputDelta
from deployments.config.load import load_app_config
from serve_app.http.openai_ingress import OpenAIIngress
from serve_app.http.pipeline.endpoints import CHAT, COMPLETIONS
from tests.doubles.app_args import app_args, tt_pool

HOUR_S = 3600.0


class GatedEngine:
    """Yields each request's first token at once, then waits for ``gate`` before the rest."""

    block_size = 16

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.produced = asyncio.Event()  # set as a first token is handed out
        self.num_running = 0

    async def generate(self, request: GenerateRequest) -> AsyncIterator[OutputDelta]:
        self.num_running += 1
        try:
            self.produced.set()
            yield OutputDelta(request.request_id, (5,), "first", request.num_prompt_tokens, 1)
            await self.gate.wait()
            yield OutputDelta(request.request_id, (6,), " second", request.num_prompt_tokens, 2)
            yield OutputDelta(
                request.request_id, (7,), " third", request.num_prompt_tokens, 3, finish_reason=FinishReason.LENGTH
            )
        finally:
            self.num_running -= 1

    async def abort(self, request_id: str) -> None:
        pass

    async def embed(self, request: Any) -> Any:
        raise NotImplementedError

    def stats(self) -> EngineStats:
        return EngineStats(num_waiting=0, num_running=self.num_running, num_kv_blocks_total=64, num_kv_blocks_free=64)

    def extra_stats(self) -> None:
        return None

    def take_kv_events(self) -> None:
        return None

    def kv_block_snapshot(self) -> None:
        return None

    async def check_health(self) -> None:
        pass

    async def shutdown(self) -> None:
        pass


@pytest.fixture
def ingress_and_engine(tiny_llama: Path) -> tuple[OpenAIIngress, GatedEngine]:
    engine = GatedEngine()
    config = load_app_config(app_args("first-token.yaml", tiny_llama, [dict(tt_pool(), placement="ingress")]))
    # An hour-long coalescing window (past what a config may set): a first token held by any
    # window would never come out.
    pools = tuple(dataclasses.replace(p, stream_interval_s=HOUR_S) for p in config.pools)
    config = dataclasses.replace(config, pools=pools)
    ingress = OpenAIIngress(config, router_handle=None, pool_handles={}, engine_factories={"tt": lambda pool: engine})
    return ingress, engine


def _request(body: dict[str, Any], path: str) -> Request:
    payload = json.dumps(body).encode()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": payload, "more_body": False}

    return Request({"type": "http", "method": "POST", "path": path, "headers": []}, receive)


def _texts(line: str) -> list[str]:
    """The generated text an SSE chunk carries (completions' ``text``, chat's ``delta.content``)."""
    out = []
    for event in line.splitlines():
        if event.startswith("data: {"):
            for choice in json.loads(event[len("data: ") :])["choices"]:
                text = choice.get("text") or (choice.get("delta") or {}).get("content")
                if text:
                    out.append(text)
    return out


async def _is_done_within(task: asyncio.Future[Any], turns: int = 50) -> bool:
    """Whether ``task`` finished while the loop ran what was ready ``turns`` times (no timer)."""
    for _ in range(turns):
        if task.done():
            return True
        await asyncio.sleep(0)
    return task.done()


async def _first_text(body: AsyncIterator[str]) -> str:
    async for line in body:
        if texts := _texts(line):
            return texts[0]
    raise AssertionError("the stream ended without text")


@pytest.mark.parametrize("is_chat", [False, True])
def test_first_token_chunk_leaves_while_the_engine_holds_the_rest(
    ingress_and_engine: tuple[OpenAIIngress, GatedEngine], is_chat: bool
) -> None:
    ingress, engine = ingress_and_engine
    if is_chat:
        body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        path, endpoint = "/v1/chat/completions", CHAT
    else:
        body = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 3, "stream": True}
        path, endpoint = "/v1/completions", COMPLETIONS

    async def run() -> list[str]:
        # A first stream, held by the engine after its first token, makes the replica busy: its
        # coalescing windows apply to the second one.
        other = await ingress._run(_request(body, path), endpoint)
        engine.produced.clear()
        second = asyncio.ensure_future(ingress._run(_request(body, path), endpoint))
        await engine.produced.wait()  # the engine has the second request's first token, not more
        # From here only in-process hand-offs remain: no window or timer may hold the token.
        assert await _is_done_within(second), "the first token was held before the response started"
        lines = second.result().body_iterator  # type: ignore[attr-defined]
        first = asyncio.ensure_future(_first_text(lines))
        assert await _is_done_within(first), "the first token's chunk was held"
        assert first.result() == "first" and not engine.gate.is_set()
        engine.gate.set()
        rest = [t async for line in lines for t in _texts(line)]
        other_texts = [t async for line in other.body_iterator for t in _texts(line)]  # type: ignore[attr-defined]
        assert "".join(other_texts) == "first second third"
        await ingress.shutdown_local_engines()
        return rest

    assert "".join(asyncio.run(run())) == " second third"
