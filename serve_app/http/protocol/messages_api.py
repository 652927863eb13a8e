"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` (Anthropic Messages API) as vLLM 0.32
serves them, with vLLM's own code at both ends of the chat path:

- request: the body is validated as vLLM's ``AnthropicMessagesRequest`` and converted with
  ``AnthropicServingMessages.to_chat_completion_request`` (system prompt as string or blocks,
  ``tool_use`` / ``tool_result`` blocks, tools, ``tool_choice``, ``stop_sequences``,
  ``max_tokens``; a streamed request asks for usage on every chunk, as vLLM's does);
- answer: the chat completion (or its chunk stream) goes through vLLM's ``messages_full_converter``
  / ``message_stream_converter``, so the Message and its events (``message_start``,
  ``content_block_*`` with ``text_delta`` / ``input_json_delta``, ``message_delta`` with
  ``stop_reason`` and usage, ``message_stop``) are vLLM's byte for byte;
- errors: after the body validated, an error is Anthropic's ``{"type": "error", "error": ...}``
  with vLLM's status and type (vLLM's ``translate_error_response``); a body that fails validation
  keeps the server's generic error shape, as vLLM's request validation answers it.

vLLM's two converters read no state of their handler (0.32: they only build response models),
so one handler object made without its engine-bound ``__init__`` runs them
(``tests/serve_app/http/protocol/test_messages_api.py`` drives both).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from serve_app.http.protocol.errors import APIError

if TYPE_CHECKING:
    from vllm.entrypoints.anthropic.protocol import AnthropicCountTokensRequest, AnthropicMessagesRequest
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages


class MessagesBodyError(APIError):
    """A ``/v1/messages`` body vLLM's request model refuses: answered in the generic error shape
    (vLLM's request validation runs before its Anthropic handler)."""


def read_messages(body: Any) -> AnthropicMessagesRequest:
    # deferred: vLLM is an optional extra; only these endpoints need its Anthropic models.
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest

    return _validate(AnthropicMessagesRequest, body)


def read_count_tokens(body: Any) -> AnthropicCountTokensRequest:
    from vllm.entrypoints.anthropic.protocol import AnthropicCountTokensRequest

    return _validate(AnthropicCountTokensRequest, body)


_Body = TypeVar("_Body", bound=BaseModel)


def _validate(model: type[_Body], body: Any) -> _Body:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise MessagesBodyError(400, str(exc)) from exc


def to_chat_body(
    request: AnthropicMessagesRequest | AnthropicCountTokensRequest, *, merge_inline_system: bool
) -> dict[str, Any]:
    """The chat-completions body vLLM 0.32 builds (only the fields the conversion set)."""
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

    chat = AnthropicServingMessages.to_chat_completion_request(request, merge_inline_system=merge_inline_system)
    dumped: dict[str, Any] = chat.model_dump(exclude_unset=True, exclude_none=True)
    return dumped


def messages_to_chat_body(body: dict[str, Any], *, merge_inline_system: bool) -> dict[str, Any]:
    """``read_messages`` then ``to_chat_body``; ``APIError`` 400 on a body vLLM refuses."""
    return to_chat_body(read_messages(body), merge_inline_system=merge_inline_system)


@functools.lru_cache(maxsize=64)
def merge_inline_system(templates: tuple[str | None, ...]) -> bool:
    """vLLM's per-model choice: merge inline system messages into the leading one when any of the
    chat templates the model applies (without tools, with tools) refuses a system message after
    the first turn (``AnthropicServingMessages._detect_merge_inline_system``)."""
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

    return any(AnthropicServingMessages._detect_merge_inline_system(t) for t in templates)


def message_from_chat(chat_response: dict[str, Any]) -> dict[str, Any]:
    """The Message vLLM renders from a finished chat completion (its JSON as vLLM sends it)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionResponse

    message = _converter().messages_full_converter(ChatCompletionResponse.model_validate(chat_response))
    dumped: dict[str, Any] = message.model_dump(exclude_none=True)
    return dumped


def message_events(chat_sse: AsyncIterator[str]) -> AsyncIterator[str]:
    """The Anthropic event stream vLLM renders from a chat stream's SSE lines (one
    ``data: ...`` event per item, usage on every chunk, ending with ``data: [DONE]``)."""
    stream: AsyncIterator[str] = _converter().message_stream_converter(chat_sse)  # type: ignore[arg-type]
    return stream


def token_count_body(input_tokens: int) -> dict[str, Any]:
    """vLLM's ``count_tokens`` answer for a prompt of ``input_tokens`` tokens."""
    from vllm.entrypoints.anthropic.protocol import AnthropicContextManagement, AnthropicCountTokensResponse

    management = AnthropicContextManagement(original_input_tokens=input_tokens)
    body: dict[str, Any] = AnthropicCountTokensResponse(
        input_tokens=input_tokens, context_management=management
    ).model_dump(exclude_none=True)
    return body


def anthropic_error_body(err: APIError) -> dict[str, Any]:
    """vLLM's ``translate_error_response``: the error's type and message in Anthropic's shape."""
    from vllm.entrypoints.anthropic.protocol import AnthropicError, AnthropicErrorResponse

    body: dict[str, Any] = AnthropicErrorResponse(
        error=AnthropicError(type=err.error_type, message=err.message)
    ).model_dump()
    return body


@functools.cache
def _converter() -> AnthropicServingMessages:
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

    # The converters use no handler state (see the module docstring); the handler's __init__
    # needs a running engine client, which the ingress does not have.
    handler: AnthropicServingMessages = object.__new__(AnthropicServingMessages)
    return handler
