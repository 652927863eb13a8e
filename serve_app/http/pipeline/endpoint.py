"""What an endpoint supplies to the generation pipeline: its parse and its render.

An endpoint turns its raw JSON body into an OpenAI completion or chat request (``read``), and
turns the finished or streamed choices back into its own wire shape (``render_body``,
``render_stream``). Everything between (limits, model resolution, prompt, sampling, routing,
streaming) is shared and steered by the request's type, never by endpoint flags. A chat-shaped
endpoint (Responses, Anthropic messages) converts its body to a chat body and keeps whatever it
needs to render in ``EndpointRequest.state``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi.responses import Response

from accel.contract import OutputDelta
from accel.text.tokenizer import TextTokenizer
from serve_app.http import stream_render
from serve_app.http.json_io import error_response
from serve_app.http.protocol import responses as rsp
from serve_app.http.protocol.chat import ChatCompletionRequest
from serve_app.http.protocol.completions import CompletionRequest
from serve_app.http.protocol.errors import APIError
from serve_app.http.protocol.tool_output import ChoiceParser


@dataclass(frozen=True)
class EndpointRequest:
    """An endpoint's parsed body. ``body``: the OpenAI-shaped JSON the limits read (a chat body
    for a chat-shaped endpoint); ``state``: the endpoint's own, handed back at render."""

    request: CompletionRequest | ChatCompletionRequest
    body: Mapping[str, Any]
    state: object = None


@dataclass(frozen=True)
class Generation:
    """The stream stage's value: the merged engine streams and what rendering them needs."""

    merged: stream_render.Merged
    choices: list[rsp.ChoiceState]  # one per engine request; filled as deltas arrive
    opts: rsp.RenderOptions
    tok: TextTokenizer
    prompts: Sequence[tuple[int, ...]]
    parsers: list[ChoiceParser] | None  # vLLM tool/reasoning parsers, one per choice
    max_tokens: int | None  # the first choice's, as the Responses object reports it
    state: object  # EndpointRequest.state


class Endpoint(ABC):
    """One generation endpoint. ``id_prefix`` starts its response and engine request ids."""

    id_prefix: str

    @abstractmethod
    def read(self, body: Any) -> EndpointRequest:
        """The parsed request; ``APIError`` / ``InvalidRequestError`` naming the field."""

    def for_model(self, parsed: EndpointRequest, tok: TextTokenizer) -> EndpointRequest:
        """The parsed request once its model is known (a conversion that depends on the model's
        chat template redoes itself here); unchanged by default."""
        del tok
        return parsed

    def render_error(self, err: APIError) -> Response:
        """A refused or failed request's answer: OpenAI's error JSON unless the endpoint's API
        has its own error shape."""
        return error_response(err)

    @abstractmethod
    async def render_body(self, gen: Generation) -> Response:
        """The non-streamed answer once every choice finished (consumes ``gen.merged``)."""

    @abstractmethod
    def render_stream(self, gen: Generation, first: tuple[int, OutputDelta] | None) -> AsyncIterator[str]:
        """The SSE lines of a streamed answer; ``first``: the delta already taken (None: none)."""
