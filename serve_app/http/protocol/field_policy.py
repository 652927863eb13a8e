"""Every request field vLLM 0.32's OpenAI server accepts, and what we do with it.

A field is one of:
- ``HONOURED``: parsed by our request model and carried to the engine (or the response) on every
  engine kind;
- ``Refused``: answered with a 400 that names it whenever a request *uses* it (its value differs
  from vLLM's default), so a field is never dropped silently;
- ``Ignored``: vLLM's own server ignores it on these endpoints too (we say why).

Fields vLLM does not know stay ignored, as vLLM ignores them (``extra="ignore"``).
``tests/serve_app/http/protocol/test_field_policy.py`` walks vLLM's installed request models field by
field against these tables, so a field vLLM adds fails the test until it is classified here.
Work that adds a field flips its entry from ``Refused`` to ``HONOURED`` (one line per field).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from serve_app.http.protocol.errors import APIError


@dataclass(frozen=True)
class Honoured:
    """Parsed and carried on every engine kind."""


@dataclass(frozen=True)
class Refused:
    """A 400 naming the field whenever a request uses it.

    ``default``: vLLM's default (a request sending exactly this does not use the field).
    ``example``: a value that uses it (the policy test sends it and expects the 400).
    ``in_use``: when "not the default" is too coarse (e.g. ``response_format`` type "text" is fine).
    ``example_needs``: other fields the example is only valid with (for the policy test).
    """

    default: Any
    example: Any
    why: str = ""
    in_use: Callable[[Any], bool] | None = None
    example_needs: Mapping[str, Any] | None = None

    def is_used(self, value: Any) -> bool:
        if self.in_use is not None:
            return self.in_use(value)
        return value is not None and value != self.default


@dataclass(frozen=True)
class Ignored:
    """vLLM's server ignores it on the generation endpoints too."""

    why: str


HONOURED = Honoured()
FieldPolicy = Honoured | Refused | Ignored


_NO_MM = "meshserve serves text-only models"

# Both endpoints.
_COMMON: dict[str, FieldPolicy] = {
    "model": HONOURED,
    "frequency_penalty": HONOURED,
    "logit_bias": HONOURED,
    "logprobs": HONOURED,
    "max_tokens": HONOURED,
    "n": HONOURED,
    "presence_penalty": HONOURED,
    "seed": HONOURED,
    "stop": HONOURED,
    "stream": HONOURED,
    "stream_options": HONOURED,
    "temperature": HONOURED,
    "top_p": HONOURED,
    "user": HONOURED,  # vLLM ignores it; we also use it as a session-affinity key
    "top_k": HONOURED,
    "min_p": HONOURED,
    "repetition_penalty": HONOURED,
    "stop_token_ids": HONOURED,
    "include_stop_str_in_output": HONOURED,
    "ignore_eos": HONOURED,
    "min_tokens": HONOURED,
    "skip_special_tokens": HONOURED,
    "add_special_tokens": HONOURED,
    "return_token_ids": HONOURED,
    "session_id": HONOURED,  # the router's session-affinity key
    "use_beam_search": Refused(False, True, "beam search is not implemented"),
    "watermarking": Refused(None, True, "watermarking is not implemented"),
    "length_penalty": Refused(1.0, 0.5, "it applies to beam search, which is not implemented"),
    "spaces_between_special_tokens": Refused(True, False),
    "truncate_prompt_tokens": HONOURED,
    "truncation_side": HONOURED,
    "allowed_token_ids": HONOURED,
    "prompt_logprobs": HONOURED,  # on vLLM pools; a 400 naming it where a TT pool may serve it
    "logprob_token_ids": Refused(None, [1], example_needs={"logprobs": 1}),
    "bad_words": HONOURED,
    "response_format": HONOURED,
    "structured_outputs": HONOURED,
    "priority": Refused(0, 1, "priority scheduling is not enabled (vLLM's default server refuses it too)"),
    "request_id": HONOURED,
    "return_tokens_as_token_ids": HONOURED,
    "routed_experts_prompt_start": Refused(0, 1, "routed-expert data is not returned"),
    "cache_salt": HONOURED,  # vLLM: prompt cache_salt; TT + router: salted block-hash chains
    "kv_transfer_params": Refused(None, {"do_remote_decode": True}, "prefill/decode hand-off is internal"),
    "ec_transfer_params": Refused(None, {"x": 1}, _NO_MM),
    "vllm_xargs": Refused(None, {"x": 1}, "no custom extensions are installed"),
    "repetition_detection": Refused(None, {"max_pattern_size": 4, "min_count": 2}),
    "thinking_token_budget": Refused(None, 16),
    "stream_interval": Refused(None, 4, example_needs={"stream": True}),
    "return_token_offsets": Ignored("only the render endpoints return offsets (vLLM ignores it here)"),
    "mm_payload": Ignored("only the render endpoints use it (vLLM ignores it here)"),
    "return_mm_kwargs": Ignored("a deprecated alias of mm_payload (vLLM ignores it here)"),
}

CHAT_FIELDS: dict[str, FieldPolicy] = {
    **_COMMON,
    "messages": HONOURED,
    "top_logprobs": HONOURED,
    "max_completion_tokens": HONOURED,
    "add_generation_prompt": HONOURED,
    "continue_final_message": HONOURED,
    "chat_template": HONOURED,
    # Tools and reasoning: through vLLM's own request model and parsers (tool_request / tool_output).
    "tools": HONOURED,
    "tool_choice": HONOURED,
    "parallel_tool_calls": HONOURED,
    "reasoning_effort": HONOURED,  # a chat template variable (and enable_thinking), as vLLM
    "include_reasoning": HONOURED,
    "echo": HONOURED,  # the continued message's content before the choices' text (vLLM)
    "documents": HONOURED,  # a chat template variable, as vLLM
    "chat_template_kwargs": HONOURED,
    "media_io_kwargs": Refused(None, {"image": {}}, _NO_MM),
    "mm_processor_kwargs": Refused(None, {"x": 1}, _NO_MM),
    "return_prompt_text": Refused(None, True),
}

COMPLETION_FIELDS: dict[str, FieldPolicy] = {
    **_COMMON,
    "prompt": HONOURED,
    "echo": HONOURED,  # with logprobs: a 400 naming echo (prompt logprobs)
    "suffix": Refused(None, "x", "no served model implements fill-in-the-middle"),
    "prompt_embeds": Refused(None, "AAAA", "prompt embeddings are not accepted"),
}


def check_fields(body: Mapping[str, Any], is_chat: bool) -> None:
    """A 400 naming the first field of ``body`` that is refused and used (before parsing, so a
    refused field never reaches a model that would drop it)."""
    table = CHAT_FIELDS if is_chat else COMPLETION_FIELDS
    for name, value in body.items():
        policy = table.get(name)
        if isinstance(policy, Refused) and policy.is_used(value):
            why = f" ({policy.why})" if policy.why else ""
            raise APIError(400, f"`{name}` is not supported by this server{why}.", name)
