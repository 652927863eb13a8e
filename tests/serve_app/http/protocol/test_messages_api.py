"""The ``/v1/messages`` body -> chat body conversion (vLLM 0.32's own converter)."""

from __future__ import annotations

import pytest

from serve_app.http.protocol.errors import APIError
from serve_app.http.protocol.messages_api import messages_to_chat_body

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
