"""End to end on a real (small) Ray Serve with the real TT engine: the front door's auth, limits and
health, through the official ``openai`` client and raw HTTP (issue 15).

One app for the module: API key required, a 64 KiB body bound, a concurrency bound of 4 engine
requests, one TT replica taking 2 requests at a time with 1 queued per handle (Serve's bounds:
past them 503), so killing it leaves the model with none: /health 503, /v1/models empty.
"""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.doubles.app_args import app_args, tt_pool
from tests.doubles.deployed_app import deployed_app

pytestmark = pytest.mark.slow

APP = "ingress-edge-e2e"
KEY = "sk-edge-test"
POOL = "TTMeshReplica-tt"
MAX_BYTES = 64 * 1024


def _args(tiny_llama) -> dict:
    # Serve's bounds on the one replica: 2 running, 1 queued per handle (past them 503).
    pool = {**tt_pool(max_model_len=256), "max_ongoing_requests": 2, "max_queued_requests": 1}
    ingress = {"api_keys": [KEY], "max_request_bytes": MAX_BYTES, "max_concurrent_requests": 4}
    return app_args("test_ingress_edge", tiny_llama, [pool], ingress=ingress)


@pytest.fixture(scope="module")
def base_url(serve_session, tiny_llama):
    with deployed_app(serve_session, APP, _args(tiny_llama)) as url:
        _wait_health(url, 200)
        yield url


def _wait_health(url: str, status: int, timeout_s: float = 90) -> float:
    start = time.monotonic()
    while True:
        got = httpx.get(f"{url}/health", timeout=10).status_code
        if got == status:
            return time.monotonic() - start
        assert time.monotonic() - start < timeout_s, f"/health stayed {got}, wanted {status}"
        time.sleep(0.1)


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def _post(url: str, path: str, body, headers=None, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEY}", **(headers or {})}
    if isinstance(body, (bytes, str)):
        return httpx.post(f"{url}{path}", content=body, headers=headers, timeout=60, **kw)
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=60, **kw)


def test_api_key_required_on_v1_not_on_health(base_url):
    with pytest.raises(openai.AuthenticationError) as info:
        _client(base_url, "wrong").models.list()
    assert info.value.status_code == 401 and info.value.body["type"] == "AuthenticationError"
    r = httpx.post(f"{base_url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == 401
    assert httpx.get(f"{base_url}/health", timeout=30).status_code == 200
    (model,) = _client(base_url, KEY).models.list().data
    assert model.id == "tiny-llama"
    r = _client(base_url, KEY).completions.create(model="tiny-llama", prompt="hi", max_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3


def test_limits_answer_clear_errors(base_url):
    # A body over the bound: 413 from its Content-Length, before the rest is read.
    r = _post(base_url, "/v1/completions", b"{" + b" " * (2 * MAX_BYTES) + b"}")
    assert r.status_code == 413 and r.json()["error"]["type"] == "RequestEntityTooLargeError"
    # A lone surrogate in a JSON string: 400 naming the field (the tokenizer never sees it).
    r = _post(base_url, "/v1/completions", '{"prompt": "a\\ud800b", "max_tokens": 2}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    # A client chat template is refused (no trust_request_chat_template).
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as info:
        _client(base_url, KEY).chat.completions.create(
            model="tiny-llama", messages=msgs, max_tokens=2, extra_body={"chat_template": "{{ 'x' }}"}
        )
    assert "trust-request-chat-template" in info.value.message
    # Fan-out over the concurrency bound (2 prompts x n=3 = 6 > 4 engine requests): 400 naming n.
    r = _post(base_url, "/v1/completions", {"prompt": ["a", "b"], "n": 3, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    # Not JSON / wrong content: 400, never 500.
    assert _post(base_url, "/v1/completions", b"{not json").status_code == 400
    assert _post(base_url, "/v1/completions", b"[1, 2]").status_code == 400
    # The ingress still serves.
    assert _post(base_url, "/v1/completions", {"prompt": "hi", "max_tokens": 2}).status_code == 200


def test_fuzz_openapi_operations_never_5xx(base_url):
    """schemathesis over /openapi.json (the request models are declared there): schema-valid and
    schema-violating bodies for every operation; never a 5xx, never a hang (30 s timeout)."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis.generation.modes import GenerationMode

    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions"}
    seen: list[int] = []
    negative_paths: set[str] = set()
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case) -> None:
                response = case.call(base_url=base_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
                seen.append(response.status_code)
                assert response.status_code < 500, (case.path, case.body, response.text[:500])
                if case.meta is not None and case.meta.generation.mode is GenerationMode.NEGATIVE:
                    negative_paths.add(case.path)

            try:
                run()
            except Unsatisfiable:  # nothing in the schema to violate (no body, no parameters)
                assert mode is GenerationMode.NEGATIVE
    assert {"/v1/completions", "/v1/chat/completions"} <= negative_paths
    assert seen and 200 in seen and 400 in seen  # both kinds of body reached the server


_VALID = {"model": "tiny-llama", "prompt": "hello there", "max_tokens": 2}


def _mutated_bodies():
    from hypothesis import strategies as st

    json_values = st.recursive(
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**70), max_value=2**70)
        | st.floats(allow_nan=True, allow_infinity=True)
        | st.text(alphabet=st.characters(codec=None, exclude_categories=())),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
        max_leaves=12,
    )
    fields = st.sampled_from(
        [
            "prompt",
            "messages",
            "max_tokens",
            "n",
            "temperature",
            "top_p",
            "top_k",
            "seed",
            "stop",
            "logit_bias",
            "logprobs",
            "stream",
            "stream_options",
            "min_tokens",
            "stop_token_ids",
            "model",
            "response_format",
            "tools",
        ]
    )
    mutated = st.builds(lambda k, v: json.dumps({**_VALID, k: v}), fields, json_values)
    raw = st.sampled_from(
        [
            '{"prompt": NaN, "max_tokens": 2}',
            '{"prompt": "a", "max_tokens": 1e400}',
            '{"prompt": "a", "temperature": Infinity}',
            '{"prompt": "\\udc80\\ud800"}',
            '{"prompt": [[]]}',
            '{"prompt": [-1]}',
            '{"prompt": [99999999999]}',
            "null",
            "",
            "[]",
            '"x"',
        ]
    )
    truncated = st.builds(lambda s, i: s[:i], mutated, st.integers(min_value=0, max_value=40))
    body = st.one_of(mutated, raw, truncated)
    content_type = st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded", ""])
    path = st.sampled_from(["/v1/completions", "/v1/chat/completions"])
    return st.tuples(path, body, content_type)


def test_fuzz_mutated_bodies_never_5xx(base_url):
    """hypothesis-mutated bodies: wrong types, huge numbers, NaN, odd Unicode, truncated JSON,
    wrong content types; never a 5xx, never a hang."""
    from hypothesis import HealthCheck, given, settings

    statuses: list[int] = []

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(sample=_mutated_bodies())
    def run(sample) -> None:
        path, body, content_type = sample
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": content_type}
        r = httpx.post(f"{base_url}{path}", content=body.encode("utf-8", "surrogatepass"), headers=headers, timeout=30)
        statuses.append(r.status_code)
        assert r.status_code < 500, (path, body[:300], r.text[:300])

    run()
    assert 400 in statuses
    assert _post(base_url, "/v1/completions", _VALID).status_code == 200  # still serving


def test_overload_answers_only_429_or_503_with_retry_after_then_recovers(base_url):
    """Fault item 5: 40 requests at once, 10x the ingress's bound of 4 engine requests (and past the
    pool's 2 running + 1 queued): every answer is a 200 or a 429/503 with Retry-After and an
    OpenAI error body, never another status. Afterwards nothing is held: the ingress takes its
    full bound at once again (no 429), requests succeed, the engine is idle with every KV block free."""
    import asyncio

    from tests.doubles.handle_loop import HANDLES

    url = f"{base_url}/v1/completions"
    body = {"model": "tiny-llama", "prompt": [1, 5, 9, 13, 17], "max_tokens": 48, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {KEY}"}

    async def at_once(n: int) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=n)) as http:
            return list(await asyncio.gather(*(http.post(url, json=body, headers=headers) for _ in range(n))))

    burst = asyncio.run(at_once(40))
    statuses = [r.status_code for r in burst]
    counts = {s: statuses.count(s) for s in sorted(set(statuses))}
    print(json.dumps({"overload_status_counts": counts}))
    assert set(statuses) <= {200, 429, 503}, counts
    rejects = [r for r in burst if r.status_code != 200]
    assert rejects and 200 in statuses, counts
    for r in rejects:
        assert r.headers.get("retry-after") == "1" and r.json()["error"]["code"] == r.status_code
    # Recovery: every ingress slot is free again (4 at once: none refused by the ingress; the
    # pool's own bound may still answer 503) and requests succeed.
    after = [r.status_code for r in asyncio.run(at_once(4))]
    assert 429 not in after and set(after) <= {200, 503}, after
    assert all(_post(base_url, "/v1/completions", body).status_code == 200 for _ in range(2))

    async def engine_state() -> list[tuple[int, int, int]]:
        from ray import serve

        handle = serve.get_deployment_handle(POOL, APP)
        snaps = await handle.broadcast("routing_snapshot", {}).results_async(timeout_s=30)
        return [
            (
                s.num_inflight,
                s.stats.num_running + s.stats.num_waiting,
                s.stats.num_kv_blocks_total - s.stats.num_kv_blocks_free,
            )
            for s in snaps
        ]

    deadline = time.monotonic() + 30
    while (state := HANDLES.call(engine_state())) != [(0, 0, 0)]:
        assert time.monotonic() < deadline, state
        time.sleep(0.2)


def test_health_503_while_the_model_has_no_replica(base_url):
    import ray

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if f"{APP}#{POOL}#" in a["name"]]
    assert len(names) == 1
    ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
    to_503 = _wait_health(base_url, 503, timeout_s=30)
    before = httpx.get(f"{base_url}/health", timeout=30)
    listed = httpx.get(f"{base_url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).json()
    after = httpx.get(f"{base_url}/health", timeout=30)
    if before.status_code == after.status_code == 503:  # the replacement is not up yet
        assert "tiny-llama" in before.json()["error"]["message"] and before.headers["retry-after"]
        assert listed["data"] == []  # only models that can serve are listed
    to_200 = _wait_health(base_url, 200, timeout_s=120)
    print(json.dumps({"health_503_after_kill_s": round(to_503, 2), "health_200_again_s": round(to_200, 2)}))
    r = _client(base_url, KEY).completions.create(model="tiny-llama", prompt="hi", max_tokens=2)
    assert r.usage.completion_tokens == 2
