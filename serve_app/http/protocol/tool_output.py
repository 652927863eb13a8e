"""A chat choice's output split into reasoning, content and tool calls by vLLM's own parser
(``vllm.parser``: the model's reasoning parser and tool parser composed), streaming or whole.

The message and finish-reason rules are vLLM 0.32's ``OpenAIServingChat``
(``chat_completion_full_generator`` / ``chat_completion_stream_generator``):
- ``required`` and named tool choices always answer with ``tool_calls`` (content ``""``);
  ``auto`` only with the tool parser enabled (``enable_auto_tool_choice``); ``none`` never;
- ``finish_reason`` is ``"tool_calls"`` when an ``auto`` call was found or a ``required`` choice
  stopped; a named choice keeps ``"stop"`` (OpenAI's convention);
- ``parallel_tool_calls: false`` keeps the first call only;
- ``include_reasoning: false`` drops the reasoning.
Reasoning is returned as ``reasoning`` (vLLM 0.32's name) and ``reasoning_content`` (the name of
earlier vLLM releases and DeepSeek's API, which many clients read), the same text in both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from accel.contract import OutputDelta
from accel.text.tokenizer import TextTokenizer
from serve_app.http.protocol.chat import ChatCompletionResponse, ChatCompletionStreamResponse, ChatMessage, DeltaMessage
from serve_app.http.protocol.responses import ChoiceState, RenderOptions, chat_chunk
from serve_app.http.protocol.tool_request import ChatTools, ToolPlan


class ChoiceParser:
    """vLLM's parser for one choice (parsers are stateful: one per choice and stream)."""

    def __init__(self, tools: ChatTools, plan: ToolPlan, prompt_token_ids: Sequence[int]):
        self._tools, self._plan = tools, plan
        self._prompt = list(prompt_token_ids)
        self._parser = tools.make_parser(plan)
        self._tools_streamed = False
        if self._parser is not None:  # imported once per choice, not per streamed delta
            from vllm.entrypoints.serve.utils.tool_calls_utils import maybe_filter_parallel_tool_calls

            self._filter_parallel = maybe_filter_parallel_tool_calls

    @property
    def active(self) -> bool:
        """Whether output goes through a vLLM parser (else it is all content)."""
        return self._parser is not None

    # -- streaming ------------------------------------------------------------------------------

    def delta(self, text: str, token_ids: Sequence[int], finished: bool) -> dict[str, Any] | None:
        """The chunk's ``delta`` (content / reasoning / tool_calls), or None when the parser holds
        this text back (e.g. a partial ``<tool_call>`` tag)."""
        if self._parser is None:
            return {"content": text}
        request = self._plan.vllm_request
        message = self._parser.parse_delta(
            delta_text=text,
            delta_token_ids=list(token_ids),
            request=request,
            prompt_token_ids=self._prompt,
            finished=finished,
        )
        if message is None:
            return None
        message = self._filter_parallel(message, request)
        if message.tool_calls:
            self._tools_streamed = True
        out = _with_reasoning_content(message.model_dump(exclude_none=True))
        return out if out else None

    def stream_finish_reason(self, engine_reason: str) -> str:
        if self._tools_streamed and not self._plan.is_named_tool_choice and engine_reason == "stop":
            return "tool_calls"
        return engine_reason

    # -- whole output ---------------------------------------------------------------------------

    def message(self, text: str, token_ids: Sequence[int], engine_reason: str) -> tuple[dict[str, Any], str]:
        """(the response ``message`` without its role, the choice's finish reason)."""
        plan, request = self._plan, self._plan.vllm_request
        if self._parser is None:
            return {"content": text}, engine_reason
        from vllm.entrypoints.generate.base.protocol import ToolCall
        from vllm.renderers.chat_utils import make_tool_call_id

        self._parser.set_prompt_token_ids(self._prompt)
        reasoning, content, calls = self._parser.parse(
            text, request, enable_auto_tools=self._tools.enable_auto_tools, model_output_token_ids=list(token_ids)
        )
        if not plan.include_reasoning:
            reasoning = None
        choice = plan.tool_choice
        is_named, is_required = plan.is_named_tool_choice, choice == "required"
        tool_calls: list[Any] = []
        auto_called = False
        if is_named or is_required:
            content = content or ""
            tool_calls = list(calls or [])
        elif (
            request.tools
            and choice in ("auto", None)
            and self._tools.enable_auto_tools
            and self._tools.has_tool_parser
            and calls
        ):
            auto_called = True
            tool_calls = list(calls)
        if plan.parallel_tool_calls is False:
            tool_calls = tool_calls[:1]
        out: dict[str, Any] = {"content": content}
        if reasoning is not None:
            out["reasoning"] = reasoning
        if tool_calls:
            out["tool_calls"] = [
                ToolCall(id=tc.id or make_tool_call_id(), function=tc).model_dump(exclude_none=True)
                for tc in tool_calls
            ]
        finish = "tool_calls" if auto_called or (is_required and engine_reason == "stop") else engine_reason
        return _with_reasoning_content(out), finish


def _with_reasoning_content(message: dict[str, Any]) -> dict[str, Any]:
    if message.get("reasoning") is not None:
        message["reasoning_content"] = message["reasoning"]
    return message


def apply_parsed_messages(
    response: ChatCompletionResponse, choices: Sequence[ChoiceState], parsers: Sequence[ChoiceParser]
) -> None:
    """Split each choice's message of ``response`` with its parser, in place."""
    for out, state, parser in zip(response.choices, choices, parsers):
        if not parser.active:
            continue
        message, finish = parser.message(state.text, state.token_ids, state.finish_reason or "stop")
        out.message = ChatMessage(role="assistant", **message)
        out.finish_reason = finish


def parsed_chat_chunk(
    opts: RenderOptions, tok: TextTokenizer, choice: ChoiceState, delta: OutputDelta, parser: ChoiceParser
) -> ChatCompletionStreamResponse | None:
    """The stream chunk of ``delta`` (already added to ``choice``) with the parser's delta; None
    when there is nothing to send (the parser held the text back, no finish, no per-token data)."""
    parsed = parser.delta(delta.text, delta.new_token_ids, delta.finished)
    has_token_data = opts.return_token_ids or (opts.num_logprobs is not None and bool(delta.logprobs))
    if parsed is None and not delta.finished and not has_token_data:
        return None
    chunk = chat_chunk(opts, tok, choice, delta)
    out = chunk.choices[0]
    out.delta = DeltaMessage(**(parsed or {}))
    if delta.finish_reason is not None:
        out.finish_reason = parser.stream_finish_reason(delta.finish_reason.value)
    return chunk
