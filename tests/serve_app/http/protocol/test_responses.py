"""Deltas -> OpenAI bodies: usage with cached tokens, both logprob shapes, SSE chunks."""

from __future__ import annotations

import json

import pytest

from accel.contract import FinishReason, OutputDelta, TokenLogprob
from accel.text.tokenizer import load_tokenizer
from serve_app.http.protocol import responses as rsp


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return load_tokenizer(str(tiny_llama))


def _deltas(rid: str, ids: list[int], tok, cached: int = 0):
    out = []
    for n, t in enumerate(ids, 1):
        out.append(
            OutputDelta(
                rid,
                (t,),
                tok.decode([t]),
                5,
                n,
                cached,
                (TokenLogprob(t, -0.5, ((t, -0.5), (7, -1.5))),),
                FinishReason.LENGTH if n == len(ids) else None,
            )
        )
    return out


def _opts(**kw):
    base = dict(request_id="cmpl-1", created=1, model="m", num_logprobs=2, return_token_ids=True, include_usage=True)
    base.update(kw)
    return rsp.RenderOptions(**base)


def test_completion_response_usage_counts_prompt_once_per_prompt(tok):
    choices = [rsp.ChoiceState(index=i, prompt_index=0) for i in range(2)]
    for c in choices:
        for d in _deltas("r", [40, 41, 42], tok, cached=4):
            c.add(d)
    body = rsp.completion_response(_opts(), tok, choices, [(1, 2, 3, 4, 5)])
    assert body.usage.prompt_tokens == 5 and body.usage.completion_tokens == 6
    assert body.usage.total_tokens == 11 and body.usage.prompt_tokens_details.cached_tokens == 4
    c0 = body.choices[0]
    assert c0.finish_reason == "length" and c0.token_ids == [40, 41, 42]
    assert c0.logprobs.token_logprobs == [-0.5] * 3
    assert c0.logprobs.text_offset[0] == 0 and len(c0.logprobs.top_logprobs[0]) == 2
    assert c0.prompt_token_ids == [1, 2, 3, 4, 5]


def test_chat_logprobs_shape(tok):
    c = rsp.ChoiceState(index=0, prompt_index=0)
    for d in _deltas("r", [40, 41], tok):
        c.add(d)
    body = rsp.chat_response(_opts(request_id="chatcmpl-1"), tok, [c], (1, 2))
    entry = body.choices[0].logprobs.content[0]
    assert entry.token == tok.decode([40]) and entry.logprob == -0.5
    assert [t.logprob for t in entry.top_logprobs] == [-0.5, -1.5]
    assert entry.bytes == list(entry.token.encode())
    assert body.choices[0].message.role == "assistant"


def test_sse_chunks(tok):
    c = rsp.ChoiceState(index=0, prompt_index=0)
    d = _deltas("r", [40], tok)[0]
    line = rsp.sse(rsp.completion_chunk(_opts(), tok, c, d, 0))
    assert line.startswith("data: ") and line.endswith("\n\n")
    payload = json.loads(line[6:])
    assert payload["object"] == "text_completion" and payload["choices"][0]["finish_reason"] == "length"
    c.add(d)
    usage = json.loads(rsp.sse(rsp.chat_usage_chunk(_opts(), [c]))[6:])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 1
    role = json.loads(rsp.sse(rsp.chat_role_chunk(_opts(), 0))[6:])
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}


@pytest.mark.parametrize("is_chat", [False, True])
@pytest.mark.parametrize("finish", [None, FinishReason.STOP])
def test_fast_text_chunk_equals_the_model_path(tok, is_chat, finish):
    opts = _opts(num_logprobs=None, return_token_ids=False)
    delta = OutputDelta("r", (40,), 'h\u00e9"llo', 5, 1, 0, None, finish, "x" if finish else None)
    c = rsp.ChoiceState(index=1, prompt_index=0)
    slow = rsp.chat_chunk(opts, tok, c, delta) if is_chat else rsp.completion_chunk(opts, tok, c, delta, 0)
    assert json.loads(rsp.fast_text_chunk_sse(opts, 1, delta, is_chat)[6:]) == json.loads(rsp.sse(slow)[6:])


@pytest.mark.parametrize("is_chat", [False, True])
def test_nullable_fields_are_written_as_null_as_vllm_writes_them(tok, is_chat):
    # OpenAI's schema requires these keys (nullable); vLLM's server always writes them.
    opts = _opts(num_logprobs=None, return_token_ids=False)
    delta = OutputDelta("r", (40,), "hi", 5, 1, 0, None, None, None)
    for line in (rsp.fast_text_chunk_sse(opts, 0, delta, is_chat), rsp.sse(rsp.chat_role_chunk(opts, 0))):
        (choice,) = json.loads(line[6:])["choices"]
        assert choice["finish_reason"] is None and choice["logprobs"] is None
    (choice,) = json.loads(rsp.fast_text_chunk_sse(opts, 0, delta, is_chat)[6:])["choices"]
    assert ("stop_reason" in choice) is (not is_chat)  # completions: always; chat: once finished
    message = rsp.with_openai_nulls({"choices": [{"index": 0, "message": {"role": "assistant", "tool_calls": []}}]})
    assert message["choices"][0]["message"]["content"] is None and message["choices"][0]["logprobs"] is None
