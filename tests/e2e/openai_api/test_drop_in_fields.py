"""End to end: vLLM drop-in fields (issue 12 item 6) — seeded ``n``, the ``max_tokens`` clamp,
``/tokenize`` / ``/detokenize`` / ``/version``, ``X-Request-Id``, ``cache_salt``, ``echo``,
``prompt_logprobs``, and a field we cannot honour refused by name."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.doubles.app_args import pin
from tests.e2e.openai_api.local_app import PROMPT_IDS

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("pool", ["tt", "vllm"])
def test_seeded_n2_gives_different_reproducible_choices(client, pool):
    kw = dict(model="tiny-llama", prompt=PROMPT_IDS, max_tokens=8, temperature=1.0, n=2, seed=3)
    kw.update(extra_headers=pin(pool), extra_body={"ignore_eos": True, "return_token_ids": True})
    first = [c.model_extra["token_ids"] for c in client.completions.create(**kw).choices]
    again = [c.model_extra["token_ids"] for c in client.completions.create(**kw).choices]
    assert first[0] != first[1]  # choice i samples with seed + i, as vLLM
    assert first == again
    one = client.completions.create(**{**kw, "n": 1, "seed": 4}).choices[0].model_extra["token_ids"]
    assert one == first[1]  # choice 1 of seed 3 is seed 4


@pytest.mark.parametrize("pool", ["tt", "vllm"])
def test_max_tokens_clamped_to_the_context(client, pool):
    prompt = [0] + [(13 * i) % 900 + 3 for i in range(499)]  # 500 of max_model_len 512
    r = client.completions.create(
        model="tiny-llama",
        prompt=prompt,
        max_tokens=100,
        temperature=0,
        extra_headers=pin(pool),
        extra_body={"ignore_eos": True},
    )
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 12


def test_tokenize_round_trip(base_url, client, tiny_llama):
    tok = httpx.post(f"{base_url}/tokenize", json={"model": "tiny-llama", "prompt": "def fib(n):"}).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 512
    text = httpx.post(f"{base_url}/detokenize", json={"model": "tiny-llama", "tokens": tok["tokens"]}).json()
    assert text["prompt"].endswith("def fib(n):")
    chat = httpx.post(f"{base_url}/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    r = client.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    assert r.usage.prompt_tokens == chat["count"]  # the ids a chat request sends
    assert httpx.get(f"{base_url}/version").json()["version"]
    bad = httpx.post(f"{base_url}/detokenize", json={"tokens": [10**6]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_x_request_id_is_the_response_id(client):
    kw = dict(model="tiny-llama", prompt="hello", max_tokens=3)
    r = client.completions.create(extra_headers={"X-Request-Id": "trace-42"}, **kw)
    assert r.id == "cmpl-trace-42"
    r = client.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=3, extra_body={"request_id": "b7"}
    )
    assert r.id == "chatcmpl-b7"
    chunks = list(client.completions.create(stream=True, extra_headers={"X-Request-Id": "s1"}, **kw))
    assert {c.id for c in chunks} == {"cmpl-s1"}


@pytest.mark.parametrize("pool", ["tt", "vllm"])
def test_cache_salt_separates_prefix_caches(client, pool):
    prompt = [0] + [(17 * i + (pool == "tt")) % 900 + 3 for i in range(299)]
    kw = dict(model="tiny-llama", prompt=prompt, max_tokens=2, temperature=0, extra_headers=pin(pool))

    def cached(salt: str | None) -> int:
        body = {"cache_salt": salt} if salt else {}
        return client.completions.create(extra_body=body, **kw).usage.prompt_tokens_details.cached_tokens

    cached("alice")
    assert cached("mallory") == 0 and cached(None) == 0  # another salt, or none, shares nothing
    if pool == "vllm":  # one replica: the same salt hits (TT: 2 replicas x 2 lanes, routing decides)
        assert cached("alice") >= 128
    bad = httpx.post(f"{client.base_url}completions", json={"prompt": "x", "cache_salt": "a/b"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "cache_salt"


@pytest.mark.parametrize("pool", ["tt", "vllm"])
def test_echo_prepends_the_prompt(client, pool):
    kw = dict(model="tiny-llama", prompt="def fib(n):", max_tokens=4, temperature=0, extra_headers=pin(pool))
    plain = client.completions.create(**kw).choices[0].text
    assert client.completions.create(echo=True, **kw).choices[0].text == "def fib(n):" + plain
    streamed = "".join(c.choices[0].text for c in client.completions.create(echo=True, stream=True, **kw))
    assert streamed == "def fib(n):" + plain
    # vLLM's echo without generation: max_tokens 0 -> the prompt alone; one token is generated
    # (usage counts it), finish "length".
    kw["max_tokens"] = 0
    r = client.completions.create(echo=True, **kw)
    assert (r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens) == ("def fib(n):", "length", 1)
    chunks = list(client.completions.create(echo=True, stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks) == "def fib(n):"
    with pytest.raises(openai.BadRequestError):  # without echo, max_tokens 0 stays vLLM's 400
        client.completions.create(**kw)


def test_prompt_logprobs_on_vllm_pools_only(client, tiny_llama):
    from tests.hf_reference import hf_logprobs

    kw = dict(model="tiny-llama", prompt=PROMPT_IDS, max_tokens=2, temperature=0)
    r = client.completions.create(extra_headers=pin("vllm"), extra_body={"prompt_logprobs": 1}, **kw)
    plp = r.choices[0].model_extra["prompt_logprobs"]
    assert len(plp) == len(PROMPT_IDS) and plp[0] is None
    expected = hf_logprobs(tiny_llama, PROMPT_IDS[:1], PROMPT_IDS[1:], 1)
    for token_id, entry, (hf_lp, hf_top) in zip(PROMPT_IDS[1:], plp[1:], expected):
        assert entry[str(token_id)]["logprob"] == pytest.approx(hf_lp, abs=2e-3)
        assert str(hf_top[0]) in entry and 1 <= len(entry) <= 2  # the prompt token and the best one
    for headers in ({}, pin("tt")):  # unpinned, the router may pick the TT pool, which has none
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(extra_headers=headers, extra_body={"prompt_logprobs": 1}, **kw)
        assert err.value.body["param"] == "prompt_logprobs"


def test_refused_fields_name_themselves(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny-llama", prompt="hi", max_tokens=2, extra_body={"priority": 5})
    assert err.value.body["param"] == "priority"


def test_ping_and_load_as_vllm(base_url, client):
    """vLLM's /ping (the /health answer, GET and POST) and /load (engine requests in flight)."""
    assert httpx.get(f"{base_url}/ping").status_code == 200 and httpx.post(f"{base_url}/ping").status_code == 200
    idle = httpx.get(f"{base_url}/load").json()["server_load"]
    stream = client.completions.create(
        model="tiny-llama", prompt="count", max_tokens=200, stream=True, extra_body={"ignore_eos": True}
    )
    next(iter(stream))  # a token arrived: the request is in flight
    assert httpx.get(f"{base_url}/load").json()["server_load"] >= idle + 1
    stream.close()
