"""Tools and reasoning through the ingress, with vLLM's own parsers (``hermes``, ``qwen3``) on
the tiny checkpoint's tokenizer: the chat template receives the tools, the engine's output is
split into reasoning / content / tool_calls, and streamed deltas assemble to the non-stream
message. The engine is replaced by a scripted delta stream of a fixed model output (what a
model that emits a tool call would stream), so only the ingress is under test here."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.serve_app.http.scripted_stream import ScriptedEngine, assemble, call, make_ingress

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


@pytest.fixture(scope="module")
def hermes_ingress(tiny_llama):
    return make_ingress(tiny_llama, enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="qwen3")


def test_auto_tool_call_parsed_and_stream_assembles_to_it(hermes_ingress):
    engine = ScriptedEngine(hermes_ingress, "<think>The user wants weather.</think>Checking." + CALL)
    body = {"model": "tiny-llama", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 200}
    status, r = asyncio.run(call(hermes_ingress, body))
    assert status == 200, r
    (choice,) = r["choices"]
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls"
    assert message["reasoning"] == message["reasoning_content"] == "The user wants weather."
    assert message["content"] == "Checking."
    (tool_call,) = message["tool_calls"]
    assert tool_call["type"] == "function" and tool_call["id"].startswith("chatcmpl-tool-")
    assert tool_call["function"] == {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}

    # The template rendered the tools (Hermes style) into the prompt the engine got.
    prompt = engine.tok.decode(engine.requests[0].prompt_token_ids, skip_special_tokens=False)
    assert "<tools>\n" + json.dumps(TOOLS[0]) in prompt
    # hermes needs the tool-call markup even where a tokenizer marks it special (vLLM's adjust_request).
    assert engine.requests[0].sampling.skip_special_tokens is False

    status, chunks = asyncio.run(call(hermes_ingress, {**body, "stream": True}))
    assert status == 200
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    streamed, finish = assemble(chunks)
    assert finish == "tool_calls"
    assert streamed["content"] == message["content"] and streamed["reasoning"] == message["reasoning"]
    (scall,) = streamed["tool_calls"].values()
    assert scall["name"] == "get_weather" and json.loads(scall["arguments"]) == {"city": "Paris"}
    assert scall["id"].startswith("chatcmpl-tool-")


def test_parallel_tool_calls_false_keeps_the_first(hermes_ingress):
    ScriptedEngine(hermes_ingress, CALL + CALL.replace("Paris", "Tokyo"))
    body = {"model": "tiny-llama", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 200}
    _, r = asyncio.run(call(hermes_ingress, body))
    assert [json.loads(c["function"]["arguments"])["city"] for c in r["choices"][0]["message"]["tool_calls"]] == [
        "Paris",
        "Tokyo",
    ]
    _, r = asyncio.run(call(hermes_ingress, {**body, "parallel_tool_calls": False}))
    assert len(r["choices"][0]["message"]["tool_calls"]) == 1
    _, chunks = asyncio.run(call(hermes_ingress, {**body, "parallel_tool_calls": False, "stream": True}))
    assert list(assemble(chunks)[0]["tool_calls"]) == [0]


def test_tool_choice_none_and_no_reasoning(hermes_ingress):
    ScriptedEngine(hermes_ingress, "<think>hmm</think>" + CALL)
    body = {"model": "tiny-llama", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "none", "max_tokens": 200}
    _, r = asyncio.run(call(hermes_ingress, body))
    choice = r["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == CALL and choice["message"]["reasoning"] == "hmm"
    _, r = asyncio.run(call(hermes_ingress, {**body, "include_reasoning": False}))
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
    status, r = asyncio.run(call(hermes_ingress, body))
    assert status == 200, r
    prompt = engine.tok.decode(engine.requests[0].prompt_token_ids, skip_special_tokens=False)
    # Arguments handed to the template as a dict (vLLM parses the JSON string), re-serialized by it.
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # The prompt closed the reasoning, so the output is content (qwen3 parser on the prompt).
    assert r["choices"][0]["message"]["content"] == "Sunny." and "reasoning" not in r["choices"][0]["message"]
    _, chunks = asyncio.run(call(hermes_ingress, {**body, "stream": True}))
    streamed, finish = assemble(chunks)
    assert (streamed["content"], streamed["reasoning"], finish) == ("Sunny.", "", "stop")


def test_tool_choice_without_a_parser_is_a_400(tiny_llama):
    ingress = make_ingress(tiny_llama)
    ScriptedEngine(ingress, "hi")
    for choice in ("auto", "required", {"type": "function", "function": {"name": "get_weather"}}):
        body = {"model": "tiny-llama", "messages": MESSAGES, "tools": TOOLS, "tool_choice": choice}
        status, r = asyncio.run(call(ingress, body))
        assert status == 400 and r["error"]["param"] == "tool_choice", r
    # tools with tool_choice "none" render and answer as plain chat.
    status, r = asyncio.run(call(ingress, {**body, "tool_choice": "none"}))
    assert status == 200 and r["choices"][0]["message"]["content"] == "hi"


def test_bad_tool_choice_is_vllms_400(hermes_ingress):
    ScriptedEngine(hermes_ingress, "hi")
    bad = [
        ({"tool_choice": "required"}, "tool_choice"),  # no tools
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": []}, "tools"),
    ]
    for extra, param in bad:
        status, r = asyncio.run(call(hermes_ingress, {"model": "tiny-llama", "messages": MESSAGES, **extra}))
        assert status == 400 and r["error"]["param"] == param, r


def test_required_and_named_choices_become_the_tools_constraint(hermes_ingress):
    engine = ScriptedEngine(hermes_ingress, CALL)
    strict = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": True}}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice, finish in (("required", "tool_calls"), (named, "stop")):
        body = {"model": "tiny-llama", "messages": MESSAGES, "tools": strict, "tool_choice": choice, "max_tokens": 99}
        status, r = asyncio.run(call(hermes_ingress, body))
        assert status == 200, r
        assert r["choices"][0]["finish_reason"] == finish
        assert json.loads(r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
        spec = engine.requests[-1].sampling.structured_outputs
        # vLLM's hermes structural tag: the call envelope, the arguments pinned to the schema.
        tag = json.loads(spec.structural_tag)
        assert tag["format"]["tags"][0]["begin"] == '<tool_call>\n{"name": "get_weather", "arguments": '
        assert TOOLS[0]["function"]["parameters"] == tag["format"]["tags"][0]["content"]["json_schema"]
        # Thinking is on and not closed by the prompt: the constraint starts after "</think>".
        assert engine.tok.decode(spec.reasoning_end_token_ids) == "</think>"
    # Reasoning not wanted (vLLM's resolve_reasoning_ended: True): from the first token.
    body = {"model": "tiny-llama", "messages": MESSAGES, "tools": strict, "tool_choice": "required"}
    status, r = asyncio.run(call(hermes_ingress, {**body, "include_reasoning": False}))
    assert status == 200, r
    assert engine.requests[-1].sampling.structured_outputs.reasoning_end_token_ids == ()
