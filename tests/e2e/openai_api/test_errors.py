"""End to end: bad requests get OpenAI-shaped errors with the right status and ``param``, through
the ``openai`` client and raw HTTP."""

from __future__ import annotations

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow


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
