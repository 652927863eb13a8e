"""The ingress's reject counter is labelled with the served model, never with a client's string."""

from __future__ import annotations

import asyncio
import json

from starlette.requests import Request

from deployments.config.load import load_app_config
from serve_app.http.openai_ingress import OpenAIIngress
from serve_app.http.pipeline.endpoints import CHAT, COMPLETIONS


class Gauge:
    def set(self, value: float) -> None:
        pass


class Metrics:
    def __init__(self) -> None:
        self.rejects: list[tuple[str, int]] = []
        self.inflight = Gauge()

    def reject(self, model: str, status: int) -> None:
        self.rejects.append((model, status))


def _ingress(tiny_llama, max_concurrent: int = 8, **ingress_args) -> tuple[OpenAIIngress, Metrics]:
    config = load_app_config(
        {
            "models": [{"name": "tiny-llama", "path": str(tiny_llama)}],
            "pools": [
                {
                    "name": "tt",
                    "engine": "tt",
                    "accelerator": "cpu",
                    "model": "tiny-llama",
                    "replicas": 1,
                    "engine_args": {"max_model_len": 128},
                }
            ],
            "ingress": {"max_concurrent_requests": max_concurrent, **ingress_args},
        },
        "test_ingress_rejects",
    )
    ingress = OpenAIIngress(config, router_handle=None, pool_handles={})
    metrics = Metrics()
    ingress._metrics = metrics
    return ingress, metrics


def _request(body: dict) -> Request:
    payload = json.dumps(body).encode()

    async def receive():
        return {"type": "http.request", "body": payload, "more_body": False}

    return Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}, receive)


def test_rejects_are_labelled_with_the_served_model(tiny_llama):
    ingress, metrics = _ingress(tiny_llama)

    async def run():
        unknown = await ingress._run(_request({"model": "no-such-model", "prompt": "hi"}), COMPLETIONS)
        too_long = await ingress._run(_request({"model": "tiny-llama", "prompt": "hi " * 400}), COMPLETIONS)
        bad = await ingress._run(_request({"model": "tiny-llama", "prompt": "hi", "temperature": -1}), COMPLETIONS)
        return unknown.status_code, too_long.status_code, bad.status_code

    assert asyncio.run(run()) == (404, 400, 400)
    # The unknown name is not a label value: with one served model, that model's name is used.
    assert metrics.rejects == [("tiny-llama", 404), ("tiny-llama", 400), ("tiny-llama", 400)]


def test_busy_rejects_before_parsing_use_the_only_model(tiny_llama):
    ingress, metrics = _ingress(tiny_llama, max_concurrent=1)
    ingress._bound.held = 1
    response = asyncio.run(ingress._run(_request({"prompt": "hi"}), COMPLETIONS))
    assert response.status_code == 429 and response.headers["retry-after"]
    assert metrics.rejects == [("tiny-llama", 429)]


def _run(ingress, body: dict, is_chat: bool = False):
    response = asyncio.run(ingress._run(_request(body), CHAT if is_chat else COMPLETIONS))
    return response.status_code, json.loads(response.body)


def test_limits_answer_clear_errors_and_release_their_slots(tiny_llama):
    ingress, metrics = _ingress(tiny_llama, max_concurrent=4, max_tokens_cap=8, max_n=3)
    msgs = [{"role": "user", "content": "hi"}]
    cases = [
        ({"prompt": "\ud800"}, False, 400, "prompt"),
        ({"messages": msgs, "chat_template": "{{ 1 }}"}, True, 400, "chat_template"),
        ({"prompt": "x" * (128 * 32 + 1)}, False, 400, "prompt"),
        ({"prompt": "hi", "n": 4}, False, 400, "n"),
        ({"prompt": "hi", "max_tokens": 9}, False, 400, "max_tokens"),
        ({"prompt": ["a", "b", "c"], "n": 2}, False, 400, "n"),  # 6 engine requests > 4
    ]
    for body, is_chat, status, param in cases:
        got_status, got = _run(ingress, body, is_chat)
        assert (got_status, got["error"]["param"]) == (status, param), (body, got)
    assert ingress._bound.held == 0
    ingress._bound.held = 3  # 3 + 1 + 1 more does not fit now: 429, and the request's slot is returned
    status, got = _run(ingress, {"prompt": ["a", "b"]})
    assert status == 429 and ingress._bound.held == 3


def test_internal_errors_do_not_leak_internals(tiny_llama, monkeypatch):
    ingress, metrics = _ingress(tiny_llama)

    def boom(*args, **kwargs):
        raise KeyError("secret_internal_detail")

    monkeypatch.setattr(ingress._client, "check_routable", boom)
    status, body = _run(ingress, {"prompt": "hi"})
    assert status == 500 and "KeyError" not in body["error"]["message"]
    assert "secret_internal_detail" not in body["error"]["message"]
    assert body["error"]["type"] == "InternalServerError" and ingress._bound.held == 0


def test_tokenize_applies_the_same_limits(tiny_llama):
    ingress, _ = _ingress(tiny_llama, max_prompt_chars=10)

    def run(body):
        response = asyncio.run(ingress.tokenize(_request(body)))
        return response.status_code, json.loads(response.body)

    msgs = [{"role": "user", "content": "hi"}]
    status, body = run({"messages": msgs, "chat_template": "{{ 1 }}"})
    assert status == 400 and body["error"]["param"] == "chat_template"
    assert run({"prompt": "\ud800"})[0] == 400
    assert run({"prompt": "x" * 11})[1]["error"]["param"] == "prompt"
    status, body = run({"prompt": "hello"})
    assert status == 200 and body["count"] == len(body["tokens"]) > 0
