"""The ``/v1/messages`` body -> chat body conversion (vLLM 0.32's own converter)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from serve_app.http.protocol.errors import APIError
from serve_app.http.protocol.messages_api import (
    anthropic_error_body,
    merge_inline_system,
    message_events,
    message_from_chat,
    messages_to_chat_body,
    token_count_body,
)

pytest.importorskip("vllm")


def _convert(body: dict, merge: bool = False) -> dict:
    return messages_to_chat_body(body, merge_inline_system=merge)


def test_system_string_and_blocks_become_a_leading_system_message() -> None:
    for system in ("Be brief.", [{"type": "text", "text": "Be brief."}]):
        chat = _convert(
            {
                "model": "m",
                "max_tokens": 7,
                "system": system,
                "messages": [{"role": "user", "content": "Hi"}],
            }
        )
        assert chat["messages"][0]["role"] == "system"
        assert "Be brief." in str(chat["messages"][0]["content"])
        assert chat["messages"][-1]["role"] == "user"
        assert chat["max_tokens"] == 7


def test_stop_sequences_become_stop() -> None:
    chat = _convert(
        {
            "model": "m",
            "max_tokens": 5,
            "stop_sequences": ["END"],
            "messages": [{"role": "user", "content": "Hi"}],
        }
    )
    assert chat["stop"] == ["END"]


def test_tool_use_and_tool_result_become_a_tool_call_and_a_tool_turn() -> None:
    chat = _convert(
        {
            "model": "m",
            "max_tokens": 5,
            "tools": [
                {
                    "name": "get_weather",
                    "description": "Weather",
                    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
                }
            ],
            "tool_choice": {"type": "tool", "name": "get_weather"},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}],
                },
            ],
        }
    )
    assert chat["tools"][0]["function"]["name"] == "get_weather"
    assert chat["tool_choice"]["function"]["name"] == "get_weather"
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["user", "assistant", "tool"]
    assert chat["messages"][1]["tool_calls"][0]["id"] == "t1"
    assert chat["messages"][2]["tool_call_id"] == "t1"


def test_missing_max_tokens_is_a_400() -> None:
    with pytest.raises(APIError) as info:
        _convert({"model": "m", "messages": [{"role": "user", "content": "Hi"}]})
    assert info.value.status == 400


def _chat_response(
    content: str | None, finish: str, stop_reason: object = None, tool_calls: list | None = None
) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "tool_calls": tool_calls or []},
                "finish_reason": finish,
                "stop_reason": stop_reason,
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
    }


def test_a_finished_chat_becomes_a_message_with_vllms_stop_reason_and_usage() -> None:
    message = message_from_chat(_chat_response("Hello there", "stop", stop_reason="END"))
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["content"] == [{"type": "text", "text": "Hello there"}]
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "END")
    assert message["usage"] == {"input_tokens": 9, "output_tokens": 4}
    assert message_from_chat(_chat_response("a", "length"))["stop_reason"] == "max_tokens"
    assert message_from_chat(_chat_response("a", "stop"))["stop_reason"] == "end_turn"
    # An empty completion is one empty text block (strict clients read content[0]).
    assert message_from_chat(_chat_response(None, "stop"))["content"] == [{"type": "text", "text": ""}]


def test_a_tool_call_becomes_a_tool_use_block() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    message = message_from_chat(_chat_response(None, "tool_calls", tool_calls=[call]))
    assert message["stop_reason"] == "tool_use"
    assert message["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}
    ]


def _chunk(delta: dict | None, finish: str | None = None, usage: dict | None = None) -> str:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": choices}
    if usage is not None:
        chunk["usage"] = usage
    return f"data: {json.dumps(chunk)}\n\n"


async def _events(lines: list[str]) -> list[tuple[str, dict]]:
    async def source() -> AsyncIterator[str]:
        for line in lines:
            yield line

    out = []
    async for event in message_events(source()):
        name, data = event.strip().split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_a_chat_stream_becomes_anthropics_event_sequence() -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}
    lines = [
        _chunk({"role": "assistant", "content": ""}, usage=usage),
        _chunk({"content": "Hel"}, usage={**usage, "completion_tokens": 1}),
        _chunk({"content": "lo"}, finish="length", usage={**usage, "completion_tokens": 2}),
        _chunk(None, usage={**usage, "completion_tokens": 2, "total_tokens": 7}),
        "data: [DONE]\n\n",
    ]
    events = asyncio.run(_events(lines))
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0][1]["message"]["usage"] == {"input_tokens": 5, "output_tokens": 0}
    assert "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta") == "Hello"
    assert events[5][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert events[5][1]["usage"]["output_tokens"] == 2


def test_an_error_chunk_mid_stream_becomes_an_error_event() -> None:
    lines = [_chunk({"role": "assistant", "content": ""}), 'data: {"error": {"message": "boom"}}\n\n']
    events = asyncio.run(_events(lines))
    assert events[-1][0] == "error" and events[-1][1]["error"]["type"] == "internal_error"


def test_errors_take_anthropics_shape_with_the_servers_type() -> None:
    body = anthropic_error_body(APIError(404, "The model `x` does not exist.", "model"))
    assert body == {"type": "error", "error": {"type": "NotFoundError", "message": "The model `x` does not exist."}}


def test_merge_inline_system_follows_the_template_as_vllm_decides() -> None:
    system_first = (
        "{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
        "{{ raise_exception('system first') }}{% endif %}{{ m.content }}{% endfor %}"
    )
    anywhere = "{% for m in messages %}{{ m.role }}: {{ m.content }}{% endfor %}"
    assert merge_inline_system((system_first,)) is True
    assert merge_inline_system((anywhere,)) is False
    assert merge_inline_system((anywhere, system_first)) is True
    assert merge_inline_system((None,)) is True  # no template: vLLM merges


def test_count_tokens_answer_has_vllms_shape() -> None:
    assert token_count_body(12) == {"input_tokens": 12, "context_management": {"original_input_tokens": 12}}
