"""``POST /v1/messages`` (Anthropic Messages API), request side: the body is validated as vLLM
0.32's ``AnthropicMessagesRequest`` and converted to a chat body with vLLM's own
``AnthropicServingMessages.to_chat_completion_request`` (system prompt as string or blocks,
``tool_use`` / ``tool_result`` blocks, tools, ``tool_choice``, ``stop_sequences``,
``max_tokens``), so the chat path runs it exactly as ``vllm serve`` converts it.

Not here yet: rendering the chat answer back into a Message or its event stream, and the route.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from serve_app.http.protocol.errors import bad_request


def messages_to_chat_body(body: dict[str, Any], *, merge_inline_system: bool) -> dict[str, Any]:
    """The chat-completions body vLLM 0.32 builds from a ``/v1/messages`` body.

    ``merge_inline_system`` is vLLM's per-template choice (True when the chat template refuses a
    system message after the first turn). Raises ``APIError`` 400 on a body vLLM's model refuses.
    """
    # deferred: vLLM is an optional extra; only this endpoint needs its Anthropic models.
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

    try:
        request = AnthropicMessagesRequest.model_validate(body)
    except ValidationError as exc:
        raise bad_request(str(exc)) from exc
    chat = AnthropicServingMessages.to_chat_completion_request(request, merge_inline_system=merge_inline_system)
    return chat.model_dump(exclude_unset=True, exclude_none=True)
