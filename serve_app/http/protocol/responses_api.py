"""``POST /v1/responses``, stateless: the request's input items become a chat request that runs
the chat path (tools, parsers, routing, engines), and its answer becomes a Responses object or
the Responses event stream, built with vLLM 0.32's own pieces (``OpenAIServingResponses``'s
non-Harmony path):

- the request is validated as vLLM's ``ResponsesRequest`` (vLLM's 400s);
- input items -> chat messages with vLLM's ``construct_input_messages`` (instructions first,
  ``function_call`` items as assistant tool calls, ``function_call_output`` items as tool turns);
  function tools -> chat tools as vLLM renders them (``convert_tool_responses_to_completions_format``);
- output items from the parsed message with vLLM's ``build_response_output_items`` (reasoning
  item, message item, ``function_call`` items); events with vLLM's ``SimpleStreamingEventProcessor``
  (``response.created``, ``response.in_progress``, ``response.output_item.added``,
  ``response.output_text.delta``, ``response.reasoning_text.delta``,
  ``response.function_call_arguments.delta``, the ``.done`` events, ``response.completed``),
  each sent as ``event: <type>`` + ``data: <json>`` with increasing ``sequence_number``.

There is no response store: ``previous_response_id`` (and ``background``, which needs one) is a
400 naming it, as are the options this path does not honour (other tool kinds, prompt templates,
output logprobs...), so nothing a client sends is dropped silently.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from serve_app.http.protocol.chat import ChatCompletionResponse
from serve_app.http.protocol.errors import bad_request

# ResponsesRequest fields that map 1:1 to chat request fields (same name and meaning).
_SAME_FIELDS = (
    "model",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "include_reasoning",
    "chat_template_kwargs",
    "user",
    "session_id",
    "prompt_cache_key",
    "logit_bias",
    "stream",
    "structured_outputs",
)


@dataclass(frozen=True)
class ResponsesCall:
    """One /v1/responses request: vLLM's ``ResponsesRequest`` and the chat body it runs as."""

    request: Any  # vllm.entrypoints.openai.responses.protocol.ResponsesRequest
    chat_body: dict[str, Any]
    created: int

    @property
    def response_id(self) -> str:
        return str(self.request.request_id)


def responses_call(body: Any) -> ResponsesCall:
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.exceptions import VLLMValidationError

    if not isinstance(body, Mapping):
        raise bad_request("the request body must be a JSON object")
    try:
        request = ResponsesRequest.model_validate(dict(body))
    except ValidationError as err:
        first = err.errors()[0]
        raise bad_request(f"{'.'.join(map(str, first['loc']))}: {first['msg']}", _loc(first["loc"])) from None
    except VLLMValidationError as exc:
        raise bad_request(str(exc.args[0]) if exc.args else str(exc), exc.parameter) from None
    _refuse_unsupported(request, body)
    try:
        chat_body = _chat_body(request, body)
    except VLLMValidationError as exc:
        raise bad_request(str(exc.args[0]) if exc.args else str(exc), exc.parameter or "input") from None
    return ResponsesCall(request, chat_body, int(time.time()))


def _loc(loc: tuple[Any, ...]) -> str | None:
    return str(loc[0]) if loc else None


def _refuse_unsupported(request: Any, body: Mapping[str, Any]) -> None:
    if request.previous_response_id is not None:
        raise bad_request(
            "previous_response_id is not supported: this server keeps no response store (the Responses "
            "API is stateless here); send the whole conversation in `input`",
            "previous_response_id",
        )
    if request.background:
        raise bad_request("background responses need a response store, which this server does not keep", "background")
    if request.previous_input_messages:
        raise bad_request("previous_input_messages is not supported; send the conversation in `input`", "input")
    if request.prompt is not None:
        raise bad_request("prompt templates are not supported", "prompt")
    if request.top_logprobs:
        raise bad_request("output logprobs are not supported on /v1/responses", "top_logprobs")
    if request.is_include_output_logprobs():
        raise bad_request("output logprobs are not supported on /v1/responses", "include")
    if request.max_tool_calls is not None:
        raise bad_request("max_tool_calls is not supported", "max_tool_calls")
    if request.enable_response_messages:
        raise bad_request("enable_response_messages is not supported", "enable_response_messages")
    for name in ("cache_salt", "kv_transfer_params", "ec_transfer_params", "vllm_xargs", "media_io_kwargs"):
        if body.get(name) is not None:
            raise bad_request(f"`{name}` is not supported by this server.", name)
    if request.priority:
        raise bad_request("`priority` is not supported by this server.", "priority")
    if any(t.type != "function" for t in request.tools):
        kinds = sorted({t.type for t in request.tools if t.type != "function"})
        raise bad_request(f"only function tools are supported, got {kinds}", "tools")
    choice = request.tool_choice
    if not isinstance(choice, str) and getattr(choice, "type", None) != "function":
        raise bad_request("tool_choice must be none, auto, required or a function", "tool_choice")


def _chat_body(request: Any, body: Mapping[str, Any]) -> dict[str, Any]:
    from vllm.entrypoints.openai.responses.utils import (
        construct_input_messages,
        convert_tool_responses_to_completions_format,
    )
    from vllm.tool_parsers.utils import iter_response_function_tool_dicts

    messages = construct_input_messages(request_instructions=request.instructions, request_input=request.input)
    chat: dict[str, Any] = {k: body[k] for k in _SAME_FIELDS if k in body}
    chat["messages"] = [_chat_message(m) for m in messages]
    if request.max_output_tokens is not None:
        chat["max_completion_tokens"] = request.max_output_tokens
    if request.truncation == "auto":  # vLLM's build_tok_params: keep the prompt's end that fits
        chat["truncate_prompt_tokens"] = -1
    # vLLM renders a Responses input as chat does but tokenizes the rendered text with
    # ``TokenizeParams``' default ``add_special_tokens=True`` (its ``build_tok_params`` leaves it),
    # so a template that writes BOS itself gets a second one; greedy output follows the prompt.
    chat["add_special_tokens"] = True
    if request.tools:
        chat["tools"] = [
            convert_tool_responses_to_completions_format(t).model_dump()
            for t in iter_response_function_tool_dicts(request.tools)
        ]
        choice = request.tool_choice
        chat["tool_choice"] = (
            choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice.name}}
        )
    elif "tool_choice" in body and request.tool_choice not in ("auto", "none"):
        chat["tool_choice"] = request.tool_choice  # vLLM's chat validation answers it (no tools)
    if request.reasoning is not None and request.reasoning.effort is not None:
        chat["reasoning_effort"] = request.reasoning.effort
    text_format = request.text.format if request.text is not None else None
    if text_format is not None and text_format.type != "text":
        fmt = text_format.model_dump(by_alias=True, exclude_none=True)
        if fmt["type"] == "json_schema":
            chat["response_format"] = {
                "type": "json_schema",
                "json_schema": {k: v for k, v in fmt.items() if k != "type"},
            }
        else:
            chat["response_format"] = fmt
    if request.stream:
        chat["stream_options"] = {"include_usage": True}  # the completed event carries the usage
    return chat


def _chat_message(message: Any) -> dict[str, Any]:
    """A message of ``construct_input_messages`` as a chat message: Responses content parts
    (``input_text`` / ``output_text``) as chat text parts, ``input_image`` with an ``image_url`` as
    a chat ``image_url`` part (a ``file_id`` one is refused naming input), tool calls as plain dicts."""
    m = dict(message)
    content = m.get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            p = dict(part) if isinstance(part, Mapping) else part.model_dump()
            if p.get("type") in ("input_text", "output_text", "text"):
                parts.append({"type": "text", "text": p.get("text", "")})
            elif p.get("type") == "input_image" and isinstance(p.get("image_url"), str):
                parts.append({"type": "image_url", "image_url": {"url": p["image_url"]}})  # (chat_images reads it)
            else:
                raise bad_request(f"only text input parts are supported, got {p.get('type')!r}", "input")
        m["content"] = parts
    if m.get("tool_calls") is not None:
        m["tool_calls"] = [dict(c) if isinstance(c, Mapping) else c.model_dump() for c in m["tool_calls"]]
        for c in m["tool_calls"]:
            c["function"] = dict(c["function"])
    return m


# -- answers ------------------------------------------------------------------------------------


def _usage(prompt: int, completion: int, cached: int) -> Any:
    from vllm.entrypoints.openai.responses.protocol import InputTokensDetails, OutputTokensDetails, ResponseUsage

    return ResponseUsage(
        input_tokens=prompt,
        output_tokens=completion,
        total_tokens=prompt + completion,
        # Prompt tokens newly written to the prefix cache: not in the engine contract's deltas.
        input_tokens_details=InputTokensDetails(cached_tokens=cached, cache_write_tokens=0),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
    )


def _response(
    call: ResponsesCall, model: str, output: list[Any], status: str, usage: Any, max_tokens: int | None
) -> Any:
    from vllm.entrypoints.openai.responses.protocol import ResponsesResponse

    sampling = call.request.to_sampling_params(max_tokens or call.request.max_output_tokens or 1, {})
    return ResponsesResponse.from_request(
        call.request,
        sampling,
        model_name=model,
        created_time=call.created,
        output=output,
        status=status,  # type: ignore[arg-type]
        usage=usage,
    )


def response_from_chat(call: ResponsesCall, chat: ChatCompletionResponse, max_tokens: int | None) -> dict[str, Any]:
    """The Responses object of a non-streamed chat answer (its one choice)."""
    from vllm.entrypoints.generate.base.protocol import FunctionCall
    from vllm.entrypoints.openai.responses.utils import build_response_output_items

    (choice,) = chat.choices
    message = choice.message
    calls = [
        FunctionCall(id=tc.get("id"), name=tc["function"]["name"], arguments=tc["function"]["arguments"])
        for tc in message.tool_calls or []
    ]
    output = build_response_output_items(
        reasoning=message.reasoning, content=message.content, tool_calls=calls, tools=call.request.tools
    )
    usage = chat.usage
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    status = "incomplete" if choice.finish_reason == "length" else "completed"
    response = _response(
        call,
        chat.model,
        output,
        status,
        _usage(usage.prompt_tokens, usage.completion_tokens or 0, cached or 0),
        max_tokens,
    )
    return response.model_dump(mode="json", by_alias=True)  # type: ignore[no-any-return]


async def response_events(
    call: ResponsesCall, model: str, max_tokens: int | None, chat_sse: AsyncIterator[str]
) -> AsyncIterator[str]:
    """The Responses event stream of a streamed chat answer (its SSE lines, one choice, with a
    final usage chunk), in vLLM's ``event: <type>\\ndata: <json>`` form."""
    from vllm.entrypoints.openai.responses.protocol import (
        ResponseCompletedEvent,
        ResponseCreatedEvent,
        ResponseInProgressEvent,
    )
    from vllm.entrypoints.openai.responses.streaming_events import SimpleStreamingEventProcessor

    events = _EventLines()
    initial = _response(call, model, [], "in_progress", None, max_tokens).model_dump(mode="json", by_alias=True)
    yield events.line(ResponseCreatedEvent(type="response.created", sequence_number=-1, response=initial))
    yield events.line(ResponseInProgressEvent(type="response.in_progress", sequence_number=-1, response=initial))
    processor = SimpleStreamingEventProcessor(tools=call.request.tools)
    finish, usage = None, None
    async for line in chat_sse:
        chunk = _chat_chunk(line)
        if chunk is None:
            continue
        if "error" in chunk:  # the chat stream's last chunk: the error event ends the stream
            yield events.line(_error_event(chunk["error"]))
            return
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices", []):
            finish = choice.get("finish_reason") or finish
            for ev in _delta_events(processor, choice.get("delta") or {}):
                yield events.line(ev)
    for ev in processor.close_current():
        yield events.line(ev)
    final = _final_response(call, model, processor.output_items, finish, usage, max_tokens)
    yield events.line(ResponseCompletedEvent(type="response.completed", sequence_number=-1, response=final))


class _EventLines:
    """Events as SSE lines (``event: <type>`` + ``data: <json>``), numbered in the order sent
    (``sequence_number`` from 0)."""

    def __init__(self) -> None:
        self._next = 0

    def line(self, ev: Any) -> str:
        ev.sequence_number = self._next
        self._next += 1
        return f"event: {ev.type}\ndata: {ev.model_dump_json(indent=None, by_alias=True)}\n\n"


def _chat_chunk(line: str) -> dict[str, Any] | None:
    """The JSON chunk of one chat SSE line; None for anything else (blank, ``[DONE]``)."""
    data = line[len("data: ") :].strip() if line.startswith("data: ") else ""
    if not data or data == "[DONE]":
        return None
    chunk: dict[str, Any] = json.loads(data)
    return chunk


def _error_event(err: Mapping[str, Any]) -> Any:
    from openai.types.responses import ResponseErrorEvent

    return ResponseErrorEvent(
        type="error",
        sequence_number=-1,
        code=str(err.get("code")),
        message=str(err.get("message")),
        param=err.get("param"),
    )


def _delta_events(processor: Any, delta: dict[str, Any]) -> Iterator[Any]:
    """The events of one chat choice delta, through vLLM's ``SimpleStreamingEventProcessor``
    (which opens and closes the output items as the delta moves between text, reasoning and
    tool calls)."""
    from vllm.entrypoints.generate.base.protocol import DeltaMessage
    from vllm.entrypoints.openai.responses.streaming_events import _StateType, split_delta

    delta.pop("reasoning_content", None)
    message = DeltaMessage.model_validate({k: v for k, v in delta.items() if k != "role"})
    for dm in split_delta(message):
        target, tool_call = processor.resolve_target_state(dm)
        if target == _StateType.NONE:
            continue
        if processor.needs_transition(target, tool_call):
            yield from processor.close_current()
            yield from processor.open(target, tool_call)
        yield from processor.emit_delta(dm, None, None)


def _final_response(
    call: ResponsesCall,
    model: str,
    output: list[Any],
    finish: str | None,
    usage: Mapping[str, Any] | None,
    max_tokens: int | None,
) -> Any:
    """The ``response.completed`` event's Responses object (``incomplete`` when cut by length)."""
    usage = usage or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    status = "incomplete" if finish == "length" else "completed"
    counts = _usage(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0), cached)
    return _response(call, model, output, status, counts, max_tokens)
