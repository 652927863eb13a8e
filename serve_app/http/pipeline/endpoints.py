"""The generation endpoints: completions, chat completions and the (stateless) Responses API.

Responses is chat-shaped: its body becomes a chat body (``responses_call``) and the chat output
is rendered as a Responses object or its event stream; a new chat-shaped endpoint (Anthropic's
/v1/messages) slots in the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response

from accel.contract import OutputDelta
from serve_app.http import stream_render
from serve_app.http.pipeline.endpoint import Endpoint, EndpointRequest, Generation
from serve_app.http.protocol import conversion as conv
from serve_app.http.protocol import responses as rsp
from serve_app.http.protocol.chat import ChatCompletionResponse
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


COMPLETIONS: Endpoint = Completions()
CHAT: Endpoint = Chat()
RESPONSES: Endpoint = Responses()
