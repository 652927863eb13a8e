"""``/v1/responses`` through the ingress (stateless, on the chat path): input items and function
tools in, output items and the OpenAI event stream out, each checked against the official
``openai`` package's own models (what ``client.responses.create`` parses)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.serve_app.http.scripted_stream import ScriptedEngine, call, make_ingress

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
EVENTS = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def ingress(tiny_llama):
    return make_ingress(tiny_llama, enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="qwen3")


def test_text_answer_stream_and_non_stream(ingress):
    engine = ScriptedEngine(ingress, "<think>Easy.</think>Hello there.")
    body = {"model": "tiny-llama", "input": "Say hello", "instructions": "Be brief.", "max_output_tokens": 40}
    status, r = asyncio.run(call(ingress, body, responses=True))
    assert status == 200, r
    response = Response.model_validate(r)
    assert response.id.startswith("resp_") and response.status == "completed" and response.object == "response"
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "Easy."
    assert message.type == "message" and message.content[0].text == "Hello there."
    assert response.output_text == "Hello there."
    assert response.usage.input_tokens == engine.requests[0].num_prompt_tokens
    assert response.usage.output_tokens == len(engine.ids) and response.max_output_tokens == 40
    prompt = engine.tok.decode(engine.requests[0].prompt_token_ids, skip_special_tokens=False)
    rendered = "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nSay hello<|im_end|>"
    # As vLLM's Responses path: the rendered template tokenized with TokenizeParams' default
    # add_special_tokens (its build_tok_params leaves it), so the tokenizer adds a BOS of its own.
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    tok_params = ResponsesRequest.model_validate(body).build_tok_params(SimpleNamespace(max_model_len=512))
    assert tok_params.add_special_tokens is True
    assert prompt.startswith("<s>" + rendered)
    status, chat = asyncio.run(
        call(
            ingress,
            {
                "model": "tiny-llama",
                "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}],
                "max_tokens": 4,
            },
        )
    )
    assert status == 200, chat
    assert engine.requests[1].prompt_token_ids == engine.requests[0].prompt_token_ids[1:]  # chat: one BOS

    status, events = asyncio.run(call(ingress, {**body, "stream": True}, responses=True))
    assert status == 200
    parsed = [EVENTS.validate_python(e) for e in events]
    types = [e.type for e in parsed]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    text = "".join(e.delta for e in parsed if e.type == "response.output_text.delta")
    thought = "".join(e.delta for e in parsed if e.type == "response.reasoning_text.delta")
    assert (text, thought) == ("Hello there.", "Easy.")
    final = parsed[-1].response
    assert final.output_text == "Hello there." and final.usage.output_tokens == len(engine.ids)
    assert [o.type for o in final.output] == ["reasoning", "message"]


def test_function_tool_call_round_trip(ingress):
    engine = ScriptedEngine(ingress, CALL)
    body = {"model": "tiny-llama", "input": "Weather in Paris?", "tools": [TOOL], "max_output_tokens": 100}
    status, r = asyncio.run(call(ingress, body, responses=True))
    assert status == 200, r
    (fc,) = Response.model_validate(r).output
    assert fc.type == "function_call" and fc.name == "get_weather" and json.loads(fc.arguments) == {"city": "Paris"}
    # The tool is rendered for the template in chat form.
    prompt = engine.tok.decode(engine.requests[0].prompt_token_ids, skip_special_tokens=False)
    assert '"name": "get_weather"' in prompt and "<tools>" in prompt

    status, events = asyncio.run(call(ingress, {**body, "stream": True}, responses=True))
    parsed = [EVENTS.validate_python(e) for e in events]
    args = "".join(e.delta for e in parsed if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == {"city": "Paris"}
    (done,) = [e for e in parsed if e.type == "response.function_call_arguments.done"]
    assert done.arguments == args
    (item,) = parsed[-1].response.output
    assert item.type == "function_call" and item.name == "get_weather" and item.arguments == args

    # The next turn: the call and its output as input items (rendered as tool-call history).
    turn2 = {
        "model": "tiny-llama",
        "tools": [TOOL],
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "function_call", "call_id": fc.call_id, "name": fc.name, "arguments": fc.arguments},
            {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"},
        ],
    }
    engine = ScriptedEngine(ingress, "<think>Report it.</think>It is sunny.")
    status, r = asyncio.run(call(ingress, turn2, responses=True))
    assert status == 200, r
    assert Response.model_validate(r).output_text == "It is sunny."
    prompt = engine.tok.decode(engine.requests[0].prompt_token_ids, skip_special_tokens=False)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt


def test_stateless_refusals(ingress):
    ScriptedEngine(ingress, "hi")
    cases = [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search_preview"}]}, "tools"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"max_tool_calls": 3}, "max_tool_calls"),
    ]
    for extra, param in cases:
        status, r = asyncio.run(call(ingress, {"model": "tiny-llama", "input": "hi", **extra}, responses=True))
        assert status == 400 and r["error"]["param"] == param, (extra, r)
    status, r = asyncio.run(call(ingress, {"model": "tiny-llama", "input": "hi", "previous_response_id": "x"}, True))
    assert "store" in r["error"]["message"]


def test_truncation_auto_keeps_the_end_of_the_prompt_that_fits(ingress):
    # vLLM's ResponsesRequest.build_tok_params: truncation "auto" = truncate_prompt_tokens -1.
    engine = ScriptedEngine(ingress, "hi")
    max_model_len = ingress._models["tiny-llama"].max_model_len
    long_input = "word " * (4 * max_model_len)  # far past the context
    status, r = asyncio.run(call(ingress, {"model": "tiny-llama", "input": long_input}, responses=True))
    assert status == 400 and r["error"]["param"] == "input_tokens"
    body = {"model": "tiny-llama", "input": long_input, "truncation": "auto", "max_output_tokens": 8}
    status, r = asyncio.run(call(ingress, body, responses=True))
    assert status == 200, r
    (request,) = engine.requests
    assert request.num_prompt_tokens == max_model_len - 1  # room for the output
    assert engine.tok.decode(request.prompt_token_ids, skip_special_tokens=False).endswith("<|im_start|>assistant\n")
