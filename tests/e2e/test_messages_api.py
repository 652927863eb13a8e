"""End to end: Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) with the
official ``anthropic`` client against our stack (configs/tiny.yaml: tiny-llama on a TT pool and a
vLLM pool, each pinned by ``x-meshserve-pool``) and against a bare vLLM 0.32 server with the same
engine and tool-parser args.

Equal, on each pool: a non-streamed Message (content blocks, stop_reason, stop_sequence, usage)
with a system prompt; the streamed event sequence (event types, block types, the text and
input-JSON deltas, the final stop_reason and usage); a stop sequence taken from the answer; a
forced tool call, and the answer to a tool_use turn with its tool_result;
count_tokens; and the status and Anthropic error type of an unknown model and of a body without
``max_tokens``. Ids and thinking signatures are random per server and are left out.
"""

from __future__ import annotations

import copy
from typing import Any

import anthropic
import httpx
import pytest
import yaml

from tests.conftest import REPO_ROOT
from tests.doubles.deployed_app import deployed_app
from tests.e2e.bare_vllm import bare_vllm_server

pytestmark = pytest.mark.slow

APP = "meshserve-e2e-messages"
CONFIG = REPO_ROOT / "configs/tiny.yaml"
MODEL = "tiny-llama"
ENGINE_ARGS = {
    "max_model_len": 512,
    "max_num_seqs": 8,
    "dtype": "float32",
    "enforce_eager": True,
    "enable_prefix_caching": True,
    "block_size": 32,
    "enable_auto_tool_choice": True,
    "tool_call_parser": "hermes",
}
SYSTEM = "You answer in one short sentence."
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
TOOL = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
    },
}


def _client(url: str, pool: str | None) -> anthropic.Anthropic:
    headers = {"x-meshserve-pool": pool} if pool else None
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120, default_headers=headers)


def _message(client: anthropic.Anthropic, max_tokens: int = 12, **kwargs: Any) -> dict:
    message = client.messages.create(model=MODEL, max_tokens=max_tokens, extra_body={"temperature": 0}, **kwargs)
    dumped = message.model_dump(exclude_none=True)
    dumped.pop("id")
    dumped["usage"] = _usage(dumped["usage"])
    return dumped


def _usage(usage: dict) -> dict:
    """Usage with the prompt's total: meshserve always reports cached prompt tokens (as vLLM with
    ``--enable-prompt-tokens-details``), so a cache hit moves tokens from ``input_tokens`` to
    ``cache_read_input_tokens``; Anthropic's total input is their sum."""
    total = (
        usage["input_tokens"] + usage.get("cache_read_input_tokens", 0) + usage.get("cache_creation_input_tokens", 0)
    )
    return {"total_input_tokens": total, "output_tokens": usage["output_tokens"]}


def _events(client: anthropic.Anthropic, **kwargs: Any) -> list[tuple]:
    """Each event as (type, block type or delta type, its text / partial JSON / stop reason)."""
    out: list[tuple] = []
    with client.messages.stream(model=MODEL, max_tokens=12, extra_body={"temperature": 0}, **kwargs) as stream:
        for event in stream:
            if event.type in ("text", "input_json"):  # the SDK's own helper events
                continue
            if event.type == "message_start":
                usage = _usage(event.message.usage.model_dump(exclude_none=True))
                out.append((event.type, usage, event.message.model))
            elif event.type == "content_block_start":
                out.append((event.type, event.index, event.content_block.type))
            elif event.type == "content_block_delta":
                delta = event.delta
                out.append(
                    (event.type, event.index, delta.type, getattr(delta, "text", getattr(delta, "partial_json", None)))
                )
            elif event.type == "message_delta":
                out.append((event.type, event.delta.stop_reason, event.delta.stop_sequence, event.usage.output_tokens))
            else:
                out.append((event.type,))
    return out


def _tool_round_trip(client: anthropic.Anthropic) -> dict:
    """A forced tool call, and a turn answering a tool_use with its tool_result. The tiny random
    model rarely closes a forced call within the budget, so the second turn's tool_use is the
    client's own (as an agent replays its history), not the one the model wrote."""
    tools = [TOOL]
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    out: dict = {}
    try:
        choice = {"type": "tool", "name": "get_weather"}
        out["call"] = _message(client, 24, tools=tools, tool_choice=choice, messages=ask)
    except anthropic.APIStatusError as err:  # both servers are compared, whatever they answer
        out["call_status"] = err.status_code
    for block in out.get("call", {}).get("content", []):
        block.pop("id", None)
    turn = [
        *ask,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 21 C"}]},
    ]
    out["after_result"] = _message(client, tools=tools, messages=turn)
    return out


def _errors(url: str, pool: str | None) -> dict:
    headers = {"x-meshserve-pool": pool} if pool else {}
    post = lambda body: httpx.post(f"{url}/v1/messages", json=body, headers=headers, timeout=60)  # noqa: E731
    unknown = post({"model": "no-such-model", "max_tokens": 4, "messages": QUESTION})
    no_max = post({"model": MODEL, "messages": QUESTION})
    return {
        "unknown": (unknown.status_code, unknown.json().get("type"), unknown.json().get("error", {}).get("type")),
        "no_max_tokens": no_max.status_code,
    }


def _answers(url: str, pool: str | None, stop: str | None) -> dict:
    client = _client(url, pool)
    answers: dict = {"message": _message(client, system=SYSTEM, messages=QUESTION)}
    answers["events"] = _events(client, system=SYSTEM, messages=QUESTION)
    text = answers["message"]["content"][0].get("text", "")
    stop = stop or _stop_from(text)
    answers["stop"] = stop
    answers["stopped"] = _message(client, system=SYSTEM, messages=QUESTION, stop_sequences=[stop])
    answers["stopped_events"] = _events(client, system=SYSTEM, messages=QUESTION, stop_sequences=[stop])
    answers["tools"] = _tool_round_trip(client)
    answers["count"] = client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=QUESTION).input_tokens
    answers["errors"] = _errors(url, pool)
    return answers


def _stop_from(text: str) -> str:
    """A stop string the greedy answer meets midway (its middle characters)."""
    assert len(text) >= 6, text
    middle = len(text) // 2
    return text[middle : middle + 2]


@pytest.fixture(scope="module")
def reference(tiny_llama, tmp_path_factory) -> dict:
    log = tmp_path_factory.mktemp("bare") / "messages.log"
    with bare_vllm_server(tiny_llama, MODEL, ENGINE_ARGS, log) as url:
        return _answers(url, None, None)


@pytest.fixture(scope="module")
def ours(serve_session, reference):
    args = copy.deepcopy(yaml.safe_load(CONFIG.read_text())["applications"][0]["args"])
    with deployed_app(serve_session, APP, args, "/e2e-messages", engine_replicas=3, timeout_s=300) as url:
        yield url


@pytest.mark.parametrize("pool", ["vllm", "tt"])
def test_messages_api_answers_as_bare_vllm(ours, reference, pool):
    mine = _answers(ours, pool, reference["stop"])
    assert reference["message"]["stop_reason"] in ("end_turn", "max_tokens")
    assert reference["stopped"]["stop_reason"] == "stop_sequence"
    assert reference["events"][0][0] == "message_start" and reference["events"][-1] == ("message_stop",)
    for key in ("message", "events", "stopped", "stopped_events", "tools", "count", "errors"):
        assert mine[key] == reference[key], (pool, key)
    assert reference["errors"]["unknown"] == (404, "error", "NotFoundError")
    assert reference["errors"]["no_max_tokens"] == 400
    # The forced call is answered (the tiny model may not close it: equal to bare is the check),
    # and a tool_result turn is answered with text.
    assert reference["tools"]["call"]["stop_reason"] in ("tool_use", "max_tokens"), reference["tools"]
    assert reference["tools"]["after_result"]["content"][0]["type"] == "text", reference["tools"]
