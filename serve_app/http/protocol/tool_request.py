"""A chat request's tools, tool choice and reasoning switches, handled as vLLM 0.32's server does.

``ChatTools.prepare(body)`` builds vLLM's own ``ChatCompletionRequest`` from the fields its
parsers read (so tools / tool_choice are validated by vLLM's validators, with vLLM's messages),
applies vLLM's ``OnlineRenderer.render_chat`` rules for a model without a tool parser, and runs
the model's ``Parser.adjust_request`` (``vllm.parser``), which is where vLLM turns ``required``
and named tool choices (and, at ``tool_strict_level`` function/parameter or with ``strict``
tools, ``auto``) into a structured-output constraint built from the tools' JSON schemas: a JSON
schema, or for parsers with a structural-tag format (``hermes``...) an xgrammar structural tag.
The result, ``ToolPlan``, carries what the template needs (tool dicts, template kwargs), what
the engine needs (that constraint, ``skip_special_tokens``) and the adjusted vLLM request the
output parsers read (``serve_app.http.protocol.tool_output``).

vLLM is imported lazily: a model without parsers and a request without tools never import it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from accel.contract import SamplingParams, StructuredOutputSpec
from accel.text.tokenizer import TextTokenizer
from deployments.config.parsing import OutputParsing
from serve_app.http.protocol.errors import APIError, bad_request

# The body fields vLLM's parsers and chat-params builder read; the rest of the body is ours
# (serve_app.http.protocol.chat) and never reaches vLLM's request model.
_VLLM_FIELDS = (
    "messages",
    "model",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "include_reasoning",
    "reasoning_effort",
    "response_format",
    "structured_outputs",
    "skip_special_tokens",
    "add_generation_prompt",
    "continue_final_message",
    "documents",
)


@dataclass(frozen=True)
class ToolPlan:
    """What one chat request's tools and parsers change. ``vllm_request``: vLLM's
    ``ChatCompletionRequest`` after ``adjust_request`` (what the output parsers read);
    ``structured_outputs``: vLLM's ``StructuredOutputsParams`` forcing a tool call (None: none);
    ``skip_special_tokens``: the value the parser needs (None: the request's own)."""

    vllm_request: Any
    tool_dicts: list[dict[str, Any]] | None
    chat_template_kwargs: dict[str, Any]
    structured_outputs: Any
    skip_special_tokens: bool | None

    @property
    def tool_choice(self) -> Any:
        return self.vllm_request.tool_choice

    @property
    def is_named_tool_choice(self) -> bool:
        return not isinstance(self.tool_choice, str) and self.tool_choice is not None

    @property
    def include_reasoning(self) -> bool:
        return bool(self.vllm_request.include_reasoning)

    @property
    def parallel_tool_calls(self) -> bool | None:
        return self.vllm_request.parallel_tool_calls  # type: ignore[no-any-return]


class ChatTools:
    """One served model's tool / reasoning handling (built once per model at ingress start)."""

    def __init__(self, parsing: OutputParsing, model_name: str, tokenizer: TextTokenizer):
        self.parsing = parsing
        self.tokenizer = tokenizer
        self.parser_cls: Any = None
        self.has_reasoning_parser = False
        if parsing.has_parser:
            from vllm.parser import ParserManager

            # Refuses unknown names and tokenizers the parsers cannot work with, as vllm serve does.
            self.parser_cls = ParserManager.get_parser(
                tool_parser_name=parsing.tool_call_parser,
                reasoning_parser_name=parsing.reasoning_parser,
                enable_auto_tools=parsing.enable_auto_tool_choice,
                tool_strict_level=parsing.tool_strict_level,
                model_name=model_name,
                tokenizer=tokenizer.hf,
            )
            # (get_parser may still answer None: keep the guard the per-request checks had)
            self.has_reasoning_parser = self.parser_cls is not None and self.parser_cls.reasoning_parser_cls is not None

    @property
    def enable_auto_tools(self) -> bool:
        return self.parsing.enable_auto_tool_choice

    @property
    def has_tool_parser(self) -> bool:
        return self.parser_cls is not None and self.parser_cls.tool_parser_cls is not None

    @property
    def has_parser(self) -> bool:
        """Whether this model's output goes through a vLLM parser (``tool_output.ChoiceParser``)."""
        return self.parser_cls is not None

    def needs_plan(self, body: Mapping[str, Any]) -> bool:
        """Whether this request goes through vLLM's request model: it has tools (or template
        kwargs), or the model has a reasoning parser. (A tool parser alone leaves a request
        without tools as it is: vLLM neither adjusts it nor parses its output.)"""
        return self.has_reasoning_parser or any(
            body.get(k) is not None
            for k in ("tools", "tool_choice", "chat_template_kwargs", "reasoning_effort", "documents")
        )

    def make_parser(self, plan: ToolPlan) -> Any:
        """A fresh vLLM ``Parser`` for one choice (parsers are stateful), or None."""
        if self.parser_cls is None:
            return None
        return self.parser_cls(
            self.tokenizer.hf, plan.vllm_request.tools, chat_template_kwargs=plan.chat_template_kwargs
        )

    def apply(self, plan: ToolPlan | None, sampling: SamplingParams, prompt_token_ids: Sequence[int]) -> SamplingParams:
        """The engine params with what the plan changes: the tool-choice constraint (replacing the
        request's own, as vLLM's ``adjust_request`` does), the parser's skip_special_tokens, and
        where a constraint starts (``StructuredOutputSpec.reasoning_end_token_ids``: after the
        reasoning end marker unless vLLM's ``resolve_reasoning_ended`` says the reasoning is over
        before the output starts: no reasoning parser, ``include_reasoning: false``, or a prompt
        that already closed it)."""
        if plan is None:
            return sampling
        changes: dict[str, Any] = {}
        if plan.skip_special_tokens is not None:
            changes["skip_special_tokens"] = plan.skip_special_tokens
        spec = sampling.structured_outputs
        if plan.structured_outputs is not None:
            spec = StructuredOutputSpec(**(structured_outputs_dict(plan.structured_outputs) or {}), param="tool_choice")
        if spec is not None:
            changes["structured_outputs"] = dataclasses.replace(
                spec, reasoning_end_token_ids=self._reasoning_end_ids(plan, prompt_token_ids)
            )
        return dataclasses.replace(sampling, **changes) if changes else sampling

    def _reasoning_end_ids(self, plan: ToolPlan, prompt_token_ids: Sequence[int]) -> tuple[int, ...]:
        parser = self.make_parser(plan)
        reasoning = parser.reasoning_parser if parser is not None else None
        if reasoning is None or not plan.include_reasoning or parser.is_reasoning_end(list(prompt_token_ids)):
            return ()
        end = reasoning.reasoning_end_str
        return tuple(self.tokenizer.encode(end, add_special_tokens=False)) if end else ()

    def prepare(self, body: Mapping[str, Any]) -> ToolPlan:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.exceptions import VLLMValidationError

        subset = {k: body[k] for k in _VLLM_FIELDS if k in body}
        try:
            request = ChatCompletionRequest.model_validate(subset)
        except ValidationError as err:
            raise _validation_error(err) from None
        except VLLMValidationError as exc:
            raise bad_request(str(exc.args[0]) if exc.args else str(exc), exc.parameter) from None
        self._check_tool_choice(request.tool_choice)
        tool_dicts = [t.model_dump() for t in request.tools] if request.tools is not None else None
        # vLLM's ChatCompletionRequest.build_chat_params: the request's chat_template_kwargs plus
        # reasoning_effort / documents (and enable_thinking from reasoning_effort).
        kwargs = dict(request.build_chat_params(None, "auto").chat_template_kwargs)
        original_skip, original_so = request.skip_special_tokens, request.structured_outputs
        if self.parser_cls is not None:
            # vLLM (OnlineRenderer.preprocess_chat) adjusts for a reasoning parser or a tool choice.
            if self.has_reasoning_parser or request.tool_choice != "none":
                try:
                    request = self.parser_cls(
                        self.tokenizer.hf, request.tools, chat_template_kwargs=kwargs
                    ).adjust_request(request)
                except (ValueError, VLLMValidationError) as exc:  # e.g. no callable tool for the choice
                    message = str(exc.args[0]) if exc.args else str(exc)
                    raise bad_request(message, getattr(exc, "parameter", None) or "tool_choice") from None
        # adjust_request replaces structured_outputs (a new object) when it forces a tool call.
        forced = request.structured_outputs if request.structured_outputs is not original_so else None
        return ToolPlan(
            vllm_request=request,
            tool_dicts=tool_dicts,
            chat_template_kwargs=kwargs,
            structured_outputs=forced,
            skip_special_tokens=request.skip_special_tokens if request.skip_special_tokens != original_skip else None,
        )

    def _check_tool_choice(self, choice: Any) -> None:
        """vLLM's OnlineRenderer.render_chat: a tool choice that needs a tool parser, without one."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionNamedToolChoiceParam

        if self.has_tool_parser or choice in (None, "none"):
            return
        if choice == "auto":
            raise bad_request(
                '"auto" tool choice requires enable_auto_tool_choice and tool_call_parser to be set '
                "in the model's config",
                "tool_choice",
            )
        is_named = isinstance(choice, ChatCompletionNamedToolChoiceParam)
        desc = f'function "{choice.function.name}"' if is_named else f'"{choice}"'
        message = f"tool_choice={desc} requires tool_call_parser to be set in the model's config"
        raise bad_request(message, "tool_choice")


def tool_call_arguments_as_dicts(messages: list[dict[str, Any]]) -> None:
    """Assistant tool calls' ``arguments`` (OpenAI: a JSON string) as dicts, in place, the way
    vLLM hands history to chat templates (``vllm.renderers.chat_utils._postprocess_messages``:
    malformed JSON becomes ``{}``, an empty ``tool_calls`` list is dropped)."""
    if not any(m.get("role") == "assistant" and "tool_calls" in m for m in messages):
        return
    from vllm.exceptions import VLLMValidationError
    from vllm.renderers.chat_utils import _postprocess_messages

    for m in messages:  # the dicts are ours; their tool call lists are the client's
        if m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list):
            m["tool_calls"] = [_copy_call(c) for c in m["tool_calls"]]
    try:
        _postprocess_messages(messages)  # type: ignore[arg-type]
    except VLLMValidationError as exc:
        raise bad_request(str(exc.args[0]) if exc.args else str(exc), "messages") from None


def _copy_call(call: Any) -> Any:
    if isinstance(call, dict) and isinstance(call.get("function"), dict):
        return {**call, "function": dict(call["function"])}
    return call


def structured_outputs_dict(params: Any) -> dict[str, Any] | None:
    """vLLM's ``StructuredOutputsParams`` as the request field it came from
    (``{"json": schema}`` / ``{"structural_tag": json text}``...), the set fields only."""
    if params is None:
        return None
    out: dict[str, Any] = {}
    for key in ("json", "regex", "choice", "grammar", "json_object", "structural_tag"):
        value = getattr(params, key, None)
        if value is not None and value is not False:
            out[key] = json.loads(value) if key == "json" and isinstance(value, str) else value
    return out


def _validation_error(err: ValidationError) -> APIError:
    """vLLM's request validators raise ``VLLMValidationError(parameter=...)`` inside pydantic."""
    first = err.errors()[0]
    ctx_error = (first.get("ctx") or {}).get("error")
    param = getattr(ctx_error, "parameter", None)
    if param is None and first["loc"]:
        param = str(first["loc"][0])
    message = str(ctx_error.args[0]) if ctx_error is not None and ctx_error.args else first["msg"]
    return bad_request(message, param)
