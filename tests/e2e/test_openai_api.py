"""End to end: ``configs/local.yaml`` on a real (small) Ray Serve with the REAL engines (two
TT-mesh replicas with the torch mesh model, one vLLM-CPU replica), called with the official
``openai`` client and raw HTTP.

Routing to one pool: the ``x-meshserve-pool`` header. Greedy outputs of both engine kinds
must equal HF transformers token for token.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from tests.doubles.app_args import local_app_args, pin
from tests.doubles.deployed_app import deployed_app
from tests.doubles.handle_loop import HANDLES as _HANDLES
from tests.hf_reference import hf_greedy

pytestmark = pytest.mark.slow

APP = "meshserve-e2e"
POOLS = {"tt": "TTMeshReplica-tt", "vllm": "VllmReplica-vllm"}
MAX_CONCURRENT = 6
PROMPT_IDS = [0, 17, 250, 33, 400, 5, 91]


@pytest.fixture(scope="module")
def base_url(serve_session, tiny_llama):
    args = local_app_args()
    args["ingress"]["max_concurrent_requests"] = MAX_CONCURRENT
    with deployed_app(serve_session, APP, args, "/e2e") as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tok(tiny_llama):
    from accel.text.tokenizer import load_tokenizer

    return load_tokenizer(str(tiny_llama))


async def _running_on_handle_loop(pool: str) -> int:
    from ray import serve

    handle = serve.get_deployment_handle(POOLS[pool], APP)
    return sum(s.num_running + s.num_waiting for s in await handle.broadcast("stats").results_async(timeout_s=30))


def _engine_running(pool: str) -> int:
    return _HANDLES.submit(_running_on_handle_loop(pool)).result(timeout=60)


async def _engine_running_async(pool: str) -> int:
    return await asyncio.wrap_future(_HANDLES.submit(_running_on_handle_loop(pool)))


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
    assert r.choices[0].message.content == tok.decode(expected)
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
    r = client.completions.create(
        model="tiny-llama",
        prompt=PROMPT_IDS,
        max_tokens=6,
        temperature=0,
        n=2,
        extra_body={"ignore_eos": True, "return_token_ids": True},
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
            temperature=0,
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


def test_cached_tokens_reported(client):
    prompt = [0] + [(7 * i) % 900 + 3 for i in range(299)]
    kw = dict(model="tiny-llama", prompt=prompt, max_tokens=2, temperature=0, extra_headers=pin("vllm"))
    client.completions.create(**kw)
    again = client.completions.create(**kw)
    assert again.usage.prompt_tokens_details.cached_tokens >= 128  # vLLM-CPU: full 32-token blocks (local.yaml)


async def _vllm_routing_snapshots():
    from ray import serve

    handle = serve.get_deployment_handle(POOLS["vllm"], APP)
    return await handle.broadcast("routing_snapshot", {}).results_async(timeout_s=30)


def test_vllm_replica_reports_its_blocks_to_the_router(client):
    """The vLLM replica follows vLLM's ZMQ KV events inside Serve: its poll answer without a cursor is a
    block snapshot with the prompt's full-block hashes at the routing block size (32 here)."""
    from accel.block_hash import hash_prompt_blocks

    prompt = [0] + [(11 * i) % 900 + 3 for i in range(140)]
    client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=2, temperature=0, extra_headers=pin("vllm"))
    want = set(hash_prompt_blocks(prompt, 32))
    deadline = time.monotonic() + 10
    while True:
        (snap,) = _HANDLES.submit(_vllm_routing_snapshots()).result(timeout=60)
        assert snap.publishes_kv_events and snap.block_size == 32
        if want <= set(snap.kv_blocks) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert want <= set(snap.kv_blocks)


@pytest.mark.parametrize(
    "kwargs, status, param",
    [
        (dict(temperature=-1), 400, "temperature"),
        (dict(top_p=7), 400, "top_p"),
        (dict(max_tokens=10_000), 400, "max_tokens"),
        (dict(extra_body={"top_k": -5}), 400, "top_k"),
        (dict(model="no-such-model"), 404, "model"),
        (dict(prompt="word " * 600), 400, "input_tokens"),
        (dict(extra_headers={"x-meshserve-pool": "gpu"}), 400, "x-meshserve-pool"),
    ],
)
def test_errors_are_openai_shaped(client, kwargs, status, param):
    kw = dict(model="tiny-llama", prompt="hello", max_tokens=4)
    kw.update(kwargs)
    with pytest.raises(openai.APIStatusError) as err:
        client.completions.create(**kw)
    assert err.value.status_code == status
    body = err.value.body
    assert body["param"] == param and body["code"] == status and body["message"] and body["type"]


def test_raw_http_edge_cases(base_url):
    r = httpx.post(f"{base_url}/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["model"] == "tiny-llama"  # no model: the only one served
    assert httpx.get(f"{base_url}/health").status_code == 200
    r = httpx.post(f"{base_url}/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"
    r = httpx.post(f"{base_url}/v1/chat/completions", json={"model": "tiny-llama", "messages": "nope"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


# -- vLLM drop-in fields (issue 12 item 6) -------------------------------------------------------


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
