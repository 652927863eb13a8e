"""Tools and reasoning through the ingress, with vLLM's own parsers (``hermes``, ``qwen3``) on
the tiny checkpoint's tokenizer: the chat template receives the tools, the engine's output is
split into reasoning / content / tool_calls, and streamed deltas assemble to the non-stream
message. The engine is replaced by a scripted delta stream of a fixed model output (what a
model that emits a tool call would stream), so only the ingress is under test here."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from starlette.requests import Request

from accel.contract import FinishReason, GenerateRequest, OutputDelta
from deployments.ingress.openai_ingress import OpenAIIngress
from serve_app.config.load import load_app_config

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
PARIS_CALL = {"name": "get_weather", "arguments": '{"city":"Paris"}'}  # OpenAI: arguments as JSON text
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


def _ingress(tiny_llama, **model_args: Any) -> OpenAIIngress:
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

    async def stream(self, request: GenerateRequest, route: Any) -> AsyncGenerator[OutputDelta, None]:
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


def _request(body: dict[str, Any]) -> Request:
    payload = json.dumps(body).encode()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": payload, "more_body": False}

    return Request({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}, receive)


async def _call(ingress: OpenAIIngress, body: dict[str, Any]) -> tuple[int, Any]:
    response = await ingress._handle(_request(body), is_chat=True)
    if not body.get("stream"):
        return response.status_code, json.loads(response.body)
    chunks = []
    async for line in response.body_iterator:  # type: ignore[attr-defined]
        data = line[len("data: ") :].strip()
        if data != "[DONE]":
            chunks.append(json.loads(data))
    return response.status_code, chunks


def _assemble(chunks: list[dict[str, Any]]) -> tuple[dict[str, Any], str | None]:
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


@pytest.fixture(scope="module")
def hermes_ingress(tiny_llama):
    return _ingress(tiny_llama, enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="qwen3")


def test_auto_tool_call_parsed_and_stream_assembles_to_it(hermes_ingress):
    engine = ScriptedEngine(hermes_ingress, "<think>The user wants weather.</think>Checking." + CALL)
    body = {"model": "tiny-llama", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 200}
    status, r = asyncio.run(_call(hermes_ingress, body))
    assert status == 200, r
    (choice,) = r["choices"]
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls"
    assert message["reasoning"] == message["reasoning_content"] == "The user wants weather."
    assert message["content"] == "Checking."
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"] == {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}

    # The template rendered the tools (Hermes style) into the prompt the engine got.
    prompt = engine.tok.decode(engine.requests[0].prompt_token_ids, skip_special_tokens=False)
    assert "<tools>\n" + json.dumps(TOOLS[0]) in prompt
    # hermes needs the tool-call markup even where a tokenizer marks it special (vLLM's adjust_request).
    assert engine.requests[0].sampling.skip_special_tokens is False

    status, chunks = asyncio.run(_call(hermes_ingress, {**body, "stream": True}))
    assert status == 200
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    streamed, finish = _assemble(chunks)
    assert finish == "tool_calls"
    assert streamed["content"] == message["content"] and streamed["reasoning"] == message["reasoning"]
    (scall,) = streamed["tool_calls"].values()
    assert scall["name"] == "get_weather" and json.loads(scall["arguments"]) == {"city": "Paris"}
    assert scall["id"].startswith("chatcmpl-tool-")


def test_parallel_tool_calls_false_keeps_the_first(hermes_ingress):
    ScriptedEngine(hermes_ingress, CALL + CALL.replace("Paris", "Tokyo"))
    body = {"model": "tiny-llama", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 200}
    _, r = asyncio.run(_call(hermes_ingress, body))
    assert [json.loads(c["function"]["arguments"])["city"] for c in r["choices"][0]["message"]["tool_calls"]] == [
        "Paris",
        "Tokyo",
    ]
    _, r = asyncio.run(_call(hermes_ingress, {**body, "parallel_tool_calls": False}))
    assert len(r["choices"][0]["message"]["tool_calls"]) == 1
    _, chunks = asyncio.run(_call(hermes_ingress, {**body, "parallel_tool_calls": False, "stream": True}))
    assert list(_assemble(chunks)[0]["tool_calls"]) == [0]


def test_tool_choice_none_and_no_reasoning(hermes_ingress):
    ScriptedEngine(hermes_ingress, "<think>hmm</think>" + CALL)
    body = {"model": "tiny-llama", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "none", "max_tokens": 200}
    _, r = asyncio.run(_call(hermes_ingress, body))
    choice = r["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == CALL and choice["message"]["reasoning"] == "hmm"
    _, r = asyncio.run(_call(hermes_ingress, {**body, "include_reasoning": False}))
    assert "reasoning" not in r["choices"][0]["message"]


def test_chat_template_kwargs_and_history_reach_the_template(hermes_ingress):
    engine = ScriptedEngine(hermes_ingress, "Sunny.")
    history = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": PARIS_CALL}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    body = {
        "model": "tiny-llama",
        "messages": history,
        "tools": TOOLS,
        "chat_template_kwargs": {"enable_thinking": False},
        "max_tokens": 50,
    }
    status, r = asyncio.run(_call(hermes_ingress, body))
    assert status == 200, r
    prompt = engine.tok.decode(engine.requests[0].prompt_token_ids, skip_special_tokens=False)
    # Arguments handed to the template as a dict (vLLM parses the JSON string), re-serialized by it.
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # The prompt closed the reasoning, so the output is content (qwen3 parser on the prompt).
    assert r["choices"][0]["message"]["content"] == "Sunny." and "reasoning" not in r["choices"][0]["message"]


def test_tool_choice_without_a_parser_is_a_400(tiny_llama):
    ingress = _ingress(tiny_llama)
    ScriptedEngine(ingress, "hi")
    for choice in ("auto", "required", {"type": "function", "function": {"name": "get_weather"}}):
        body = {"model": "tiny-llama", "messages": MESSAGES, "tools": TOOLS, "tool_choice": choice}
        status, r = asyncio.run(_call(ingress, body))
        assert status == 400 and r["error"]["param"] == "tool_choice", r
    # tools with tool_choice "none" render and answer as plain chat.
    status, r = asyncio.run(_call(ingress, {**body, "tool_choice": "none"}))
    assert status == 200 and r["choices"][0]["message"]["content"] == "hi"


def test_bad_tool_choice_is_vllms_400(hermes_ingress):
    ScriptedEngine(hermes_ingress, "hi")
    bad = [
        ({"tool_choice": "required"}, "tool_choice"),  # no tools
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": []}, "tools"),
    ]
    for extra, param in bad:
        status, r = asyncio.run(_call(hermes_ingress, {"model": "tiny-llama", "messages": MESSAGES, **extra}))
        assert status == 400 and r["error"]["param"] == param, r
