"""Ingress tests without engines: the ingress's ``EngineClient.stream`` replaced by a scripted
delta stream of a fixed model output (tokenized with the model's tokenizer, one token per
delta), so the HTTP layer (parsing, templates, output parsers, rendering) is what is tested."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

from starlette.requests import Request

from accel.contract import FinishReason, GenerateRequest, OutputDelta
from deployments.config.load import load_app_config
from serve_app.http.engine_client import BY_ROUTER, Placement
from serve_app.http.openai_ingress import OpenAIIngress
from serve_app.http.pipeline.endpoints import CHAT, RESPONSES


def make_ingress(tiny_llama, **model_args: Any) -> OpenAIIngress:
    config = load_app_config(
        {
            "models": [{"name": "tiny-llama", "path": str(tiny_llama), **model_args}],
            "pools": [
                {
                    "name": "tt",
                    "engine": "tt",
                    "accelerator": "cpu",
                    "model": "tiny-llama",
                    "replicas": 1,
                    "engine_args": {"max_model_len": 1024},
                }
            ],
        },
        "test_tool_calls",
    )
    return OpenAIIngress(config, router_handle=None, pool_handles={})


class ScriptedEngine:
    """Streams ``text`` (tokenized with the model's tokenizer) one token per delta, for every
    request, and records the requests it got."""

    def __init__(self, ingress: OpenAIIngress, text: str):
        self.tok = ingress._tokenizers["tiny-llama"]
        self.ids = self.tok.encode(text, add_special_tokens=False)
        self.requests: list[GenerateRequest] = []
        ingress._client.check_routable = lambda route: None  # type: ignore[method-assign]
        ingress._client.stream = self.stream  # type: ignore[method-assign]

    async def stream(
        self, request: GenerateRequest, route: Any, placed: Any = None, placement: Placement = BY_ROUTER
    ) -> AsyncGenerator[OutputDelta, None]:
        """``EngineClient.stream``'s signature."""
        self.requests.append(request)
        n = len(self.ids)
        for k, t in enumerate(self.ids):
            text = self.tok.decode(self.ids[: k + 1])[len(self.tok.decode(self.ids[:k])) :]
            yield OutputDelta(
                request.request_id,
                (t,),
                text,
                request.num_prompt_tokens,
                k + 1,
                finish_reason=FinishReason.STOP if k == n - 1 else None,
            )


def _request(body: dict[str, Any], path: str) -> Request:
    payload = json.dumps(body).encode()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": payload, "more_body": False}

    return Request({"type": "http", "method": "POST", "path": path, "headers": []}, receive)


async def call(ingress: OpenAIIngress, body: dict[str, Any], responses: bool = False) -> tuple[int, Any]:
    """POST ``body`` to /v1/chat/completions (or /v1/responses); (status, JSON body or the
    stream's data payloads)."""
    path = "/v1/responses" if responses else "/v1/chat/completions"
    response = await ingress._run(_request(body, path), RESPONSES if responses else CHAT)
    if not body.get("stream"):
        return response.status_code, json.loads(response.body)
    chunks = []
    async for text in response.body_iterator:  # type: ignore[attr-defined]
        for line in text.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: ") :]))
    return response.status_code, chunks


def assemble(chunks: list[dict[str, Any]]) -> tuple[dict[str, Any], str | None]:
    """A streamed choice's deltas joined the way the openai client's helpers do."""
    message: dict[str, Any] = {"content": "", "reasoning": "", "tool_calls": {}}
    finish = None
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            message["content"] += delta.get("content") or ""
            message["reasoning"] += delta.get("reasoning") or ""
            for tc in delta.get("tool_calls") or []:
                call = message["tool_calls"].setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
                call["id"] = tc.get("id") or call["id"]
                fn = tc.get("function") or {}
                call["name"] += fn.get("name") or ""
                call["arguments"] += fn.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return message, finish
