"""The chat stream's chunks, as vLLM's chat stream sends them without a parser: one chunk per
delta that carries tokens, even one whose text is empty (a token ending inside a UTF-8 character),
so every token's logprobs reach the client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from accel.contract import FinishReason, GenerateRequest, OutputDelta, TokenLogprob
from serve_app.http.engine_client import BY_ROUTER, Placement
from tests.hf_reference import vllm_text
from tests.serve_app.http.scripted_stream import ScriptedEngine, call, make_ingress


@pytest.fixture(scope="module")
def ingress(tiny_llama):
    return make_ingress(tiny_llama)


def _split_character_ids(tok) -> list[int]:
    """Token ids of a text whose tokens split a multi-byte character (byte-level BPE)."""
    for text in ("é ü ñ", "€ £", "日本語", "🙂 ok"):
        ids = tok.encode(text, add_special_tokens=False)
        if any("\ufffd" in tok.decode(ids[: k + 1]) for k in range(len(ids) - 1)):
            return ids
    pytest.skip("the tokenizer splits none of these characters")


@pytest.mark.parametrize("logprobs", [True, False])
def test_a_token_with_empty_text_still_gets_its_chunk(ingress, tiny_llama, logprobs):
    engine = ScriptedEngine(ingress, "x")
    ids = _split_character_ids(engine.tok)

    async def stream(
        request: GenerateRequest, route: Any, placed: Any = None, placement: Placement = BY_ROUTER
    ) -> AsyncGenerator[OutputDelta, None]:
        sent = ""
        for k, t in enumerate(ids):
            text = vllm_text(tiny_llama, request.prompt_token_ids, ids[: k + 1])  # held while a character is split
            lp = (TokenLogprob(t, -1.0 - k, ((t, -1.0 - k),)),) if logprobs else None
            yield OutputDelta(
                request.request_id,
                (t,),
                text[len(sent) :],
                request.num_prompt_tokens,
                k + 1,
                logprobs=lp,
                finish_reason=FinishReason.LENGTH if k == len(ids) - 1 else None,
            )
            sent = text

    ingress._client.stream = stream  # type: ignore[method-assign]
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    if logprobs:
        body |= {"logprobs": True, "top_logprobs": 1}
    status, events = asyncio.run(call(ingress, body))
    assert status == 200
    chunks = [e for e in events if isinstance(e, dict) and e.get("choices") and "role" not in e["choices"][0]["delta"]]
    assert len(chunks) == len(ids)  # one per token, the empty-text ones included
    assert any(c["choices"][0]["delta"].get("content") == "" for c in chunks)
    if logprobs:
        entries = [e for c in chunks for e in c["choices"][0]["logprobs"]["content"]]
        assert [e["logprob"] for e in entries] == [-1.0 - k for k in range(len(ids))]
