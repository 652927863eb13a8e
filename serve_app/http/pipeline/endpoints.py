"""The generation endpoints: completions, chat completions, the (stateless) Responses API and
Anthropic's Messages API.

Responses and Messages are chat-shaped: the body becomes a chat body (``responses_call``, vLLM's
Anthropic conversion) and the chat output is rendered as the API's object or event stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response

from accel.contract import OutputDelta
from accel.text.tokenizer import TextTokenizer
from serve_app.http import stream_render
from serve_app.http.pipeline.endpoint import Endpoint, EndpointRequest, Generation
from serve_app.http.protocol import conversion as conv
from serve_app.http.protocol import messages_api as msg
from serve_app.http.protocol import responses as rsp
from serve_app.http.protocol.chat import ChatCompletionResponse
from serve_app.http.protocol.errors import APIError
from serve_app.http.protocol.responses_api import ResponsesCall, response_events, response_from_chat, responses_call


async def _collect(gen: Generation, is_chat: bool) -> Any:
    return await stream_render.collect(gen.merged, gen.choices, gen.opts, gen.tok, gen.prompts, is_chat, gen.parsers)


class Completions(Endpoint):
    id_prefix = "cmpl"

    def read(self, body: Any) -> EndpointRequest:
        return EndpointRequest(conv.parse_request(body, False), body)

    async def render_body(self, gen: Generation) -> Response:
        out = await _collect(gen, is_chat=False)
        return JSONResponse(rsp.with_openai_nulls(out.model_dump(exclude_none=True)))

    def render_stream(self, gen: Generation, first: tuple[int, OutputDelta] | None) -> AsyncIterator[str]:
        return stream_render.completion_sse(gen.merged, first, gen.choices, gen.opts, gen.tok)


class Chat(Endpoint):
    id_prefix = "chatcmpl"

    def read(self, body: Any) -> EndpointRequest:
        return EndpointRequest(conv.parse_request(body, True), body)

    async def render_body(self, gen: Generation) -> Response:
        out = await _collect(gen, is_chat=True)
        return JSONResponse(rsp.with_openai_nulls(out.model_dump(exclude_none=True)))

    def render_stream(self, gen: Generation, first: tuple[int, OutputDelta] | None) -> AsyncIterator[str]:
        return stream_render.chat_sse(gen.merged, first, gen.choices, gen.opts, gen.tok, gen.parsers)


class Responses(Chat):
    """Stateless Responses API (no ``previous_response_id``), run as a chat request."""

    def read(self, body: Any) -> EndpointRequest:
        call = responses_call(body)
        return EndpointRequest(conv.parse_request(call.chat_body, True), call.chat_body, call)

    async def render_body(self, gen: Generation) -> Response:
        out = await _collect(gen, is_chat=True)
        assert isinstance(out, ChatCompletionResponse) and isinstance(gen.state, ResponsesCall)
        return JSONResponse(response_from_chat(gen.state, out, gen.max_tokens))

    def render_stream(self, gen: Generation, first: tuple[int, OutputDelta] | None) -> AsyncIterator[str]:
        assert isinstance(gen.state, ResponsesCall)
        return response_events(gen.state, gen.opts.model, gen.max_tokens, super().render_stream(gen, first))


class Messages(Chat):
    """``POST /v1/messages``. ``state``: vLLM's validated Anthropic request. The conversion is
    first made without merging inline system messages, then redone for a model whose chat
    template needs them merged (vLLM decides that per model, from its template). Its id is the
    chat completion's, as vLLM's Message id is."""

    def read(self, body: Any) -> EndpointRequest:
        request = msg.read_messages(body)
        return self._converted(request, merge_inline_system=False)

    def for_model(self, parsed: EndpointRequest, tok: TextTokenizer) -> EndpointRequest:
        if not msg.merge_inline_system(_chat_templates(tok)):
            return parsed
        return self._converted(parsed.state, merge_inline_system=True)

    @staticmethod
    def _converted(request: Any, *, merge_inline_system: bool) -> EndpointRequest:
        chat_body = msg.to_chat_body(request, merge_inline_system=merge_inline_system)
        return EndpointRequest(conv.parse_request(chat_body, True), chat_body, request)

    async def render_body(self, gen: Generation) -> Response:
        out = await _collect(gen, is_chat=True)
        return JSONResponse(msg.message_from_chat(rsp.with_openai_nulls(out.model_dump(exclude_none=True))))

    def render_stream(self, gen: Generation, first: tuple[int, OutputDelta] | None) -> AsyncIterator[str]:
        return msg.message_events(super().render_stream(gen, first))

    def render_error(self, err: APIError) -> Response:
        if isinstance(err, msg.MessagesBodyError):
            return super().render_error(err)
        return JSONResponse(msg.anthropic_error_body(err), status_code=err.status, headers=err.headers())


class MessagesTokenCount(Messages):
    """``POST /v1/messages/count_tokens``: the parse and prompt stages of a Messages body (its
    prompt's token count); it renders no generation."""

    def read(self, body: Any) -> EndpointRequest:
        return self._converted(msg.read_count_tokens(body), merge_inline_system=False)


def _chat_templates(tok: TextTokenizer) -> tuple[str | None, ...]:
    """The templates the model applies without and with tools (HF picks a named ``tool_use``
    template when tools are given), as vLLM's Anthropic handler probes them."""
    templates: list[str | None] = []
    no_tools: tuple[list[dict[str, Any]] | None, ...] = (None, [])
    for tools in no_tools:
        try:
            templates.append(tok.hf.get_chat_template(None, tools))
        except ValueError:  # no template at all: vLLM merges
            templates.append(None)
    return tuple(templates)


COMPLETIONS: Endpoint = Completions()
CHAT: Endpoint = Chat()
RESPONSES: Endpoint = Responses()
MESSAGES: Endpoint = Messages()
MESSAGES_TOKEN_COUNT: Endpoint = MessagesTokenCount()
