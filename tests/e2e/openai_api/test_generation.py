"""End to end: ``configs/tiny.yaml`` on a real (small) Ray Serve with the REAL engines, called
with the official ``openai`` client: completions and chat, streaming, ``n``, stop strings and
logprobs on both pools (``x-meshserve-pool``). Greedy outputs of both engine kinds must equal HF
transformers token for token.
"""

from __future__ import annotations

import pytest

from tests.doubles.app_args import pin
from tests.e2e.openai_api.local_app import PROMPT_IDS
from tests.hf_reference import hf_greedy, vllm_text

pytestmark = pytest.mark.slow


def test_models(client):
    (model,) = client.models.list().data
    assert model.id == "tiny-llama" and model.model_extra["max_model_len"] == 512


@pytest.mark.parametrize("pool", ["tt", "vllm"])
def test_completion_greedy_equals_hf(client, tiny_llama, pool):
    r = client.completions.create(
        model="tiny-llama",
        prompt=PROMPT_IDS,
        max_tokens=16,
        temperature=0,
        extra_headers=pin(pool),
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    (choice,) = r.choices
    assert choice.model_extra["token_ids"] == hf_greedy(tiny_llama, PROMPT_IDS, 16)
    assert choice.finish_reason == "length"
    assert r.usage.prompt_tokens == len(PROMPT_IDS) and r.usage.completion_tokens == 16
    assert r.usage.total_tokens == len(PROMPT_IDS) + 16
    assert isinstance(r.usage.prompt_tokens_details.cached_tokens, int)
    assert r.id.startswith("cmpl-") and r.model == "tiny-llama" and r.object == "text_completion"


@pytest.mark.parametrize("pool", ["tt", "vllm"])
def test_chat_greedy_equals_hf(client, tiny_llama, tok, pool):
    messages = [{"role": "user", "content": "def fib(n):"}]
    r = client.chat.completions.create(
        model="tiny-llama",
        messages=messages,
        max_completion_tokens=12,
        temperature=0,
        extra_headers=pin(pool),
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    expected = hf_greedy(tiny_llama, tok.apply_chat_template(messages), 12)
    assert r.choices[0].model_extra["token_ids"] == expected
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == vllm_text(tiny_llama, tok.apply_chat_template(messages), expected)
    assert r.id.startswith("chatcmpl-")


@pytest.mark.parametrize("pool", ["tt", "vllm"])
def test_streaming_matches_non_streaming(client, pool):
    kw = dict(
        model="tiny-llama",
        prompt="import os\n",
        max_tokens=10,
        temperature=0,
        extra_headers=pin(pool),
        extra_body={"ignore_eos": True},
    )
    full = client.completions.create(**kw).choices[0].text
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10

    msgs = [{"role": "user", "content": "hello"}]
    ckw = dict(
        model="tiny-llama",
        messages=msgs,
        max_tokens=8,
        temperature=0,
        extra_headers=pin(pool),
        extra_body={"ignore_eos": True},
    )
    full = client.chat.completions.create(**ckw).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **ckw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full
    assert chunks[-1].usage.completion_tokens == 8


def test_n_fans_out(client, tiny_llama):
    # n > 1 with temperature 0 is a 400 (as on vLLM); top_k 1 samples the argmax all the same.
    r = client.completions.create(
        model="tiny-llama",
        prompt=PROMPT_IDS,
        max_tokens=6,
        n=2,
        extra_body={"ignore_eos": True, "return_token_ids": True, "top_k": 1},
    )
    assert [c.index for c in r.choices] == [0, 1]
    expected = hf_greedy(tiny_llama, PROMPT_IDS, 6)
    assert all(c.model_extra["token_ids"] == expected for c in r.choices)
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens == len(PROMPT_IDS)
    chunks = list(
        client.chat.completions.create(
            model="tiny-llama",
            messages=[{"role": "user", "content": "x"}],
            max_tokens=4,
            n=2,
            stream=True,
            extra_body={"top_k": 1},
        )
    )
    assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}


@pytest.mark.parametrize("pool", ["tt", "vllm"])
def test_stop_strings(client, pool):
    kw = dict(model="tiny-llama", prompt=PROMPT_IDS, max_tokens=24, temperature=0, extra_headers=pin(pool))
    text = client.completions.create(extra_body={"ignore_eos": True}, **kw).choices[0].text
    stop = next(
        text[i : i + 2] for i in range(1, len(text) - 1) if text[i : i + 2].isascii() and text[i : i + 2].isalpha()
    )
    r = client.completions.create(stop=[stop], extra_body={"ignore_eos": True}, **kw)
    assert r.choices[0].text == text[: text.index(stop)]
    assert r.choices[0].finish_reason == "stop" and r.choices[0].model_extra["stop_reason"] == stop


@pytest.mark.parametrize("pool", ["tt", "vllm"])
def test_logprobs_both_formats(client, pool):
    r = client.completions.create(
        model="tiny-llama",
        prompt=PROMPT_IDS,
        max_tokens=5,
        temperature=0,
        logprobs=2,
        extra_headers=pin(pool),
        extra_body={"ignore_eos": True},
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == r.choices[0].text or len(r.choices[0].text) <= len("".join(lp.tokens))
    for value, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert value <= 0 and 1 <= len(top) <= 3
        assert value == pytest.approx(max(top.values()), abs=1e-4)  # greedy: the sampled token is the best
    c = client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_headers=pin(pool),
        extra_body={"ignore_eos": True},
    )
    content = c.choices[0].logprobs.content
    assert len(content) == 4 and all(len(e.top_logprobs) == 2 for e in content)
    assert all(e.logprob == pytest.approx(e.top_logprobs[0].logprob, abs=1e-4) for e in content)
