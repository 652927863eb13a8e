"""The ingress's request limits (``ingress:`` settings), checked before any work is spent on a
request: each violation is a 400 (or 429) naming the field, with a message that says the limit.

- text: lone UTF-16 surrogates (JSON ``"\\ud800"``) are not Unicode a tokenizer can encode; the
  request is refused naming its top-level field, instead of crashing the tokenizer;
- prompt characters: the request's prompt text (all prompts, all messages) against a cap, before
  tokenizing (``IngressConfig.prompt_char_cap``);
- chat templates sent by the client are refused unless ``trust_request_chat_template`` (vLLM's
  message and rule);
- n against ``max_n`` (its upper bound's one place; ``conversion`` refuses n < 1); max_tokens
  against ``max_tokens_cap`` (which is also the default), read from the parsed request by
  ``max_tokens.requested_max_tokens``, its one reading;
- fan-out: a request holds one slot of ``max_concurrent_requests`` per engine request (prompts x
  n), taken as a whole or not at all (``ConcurrencyBound``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from accel.contract import SamplingParams
from deployments.config.ingress import IngressConfig
from serve_app.http.protocol.chat import ChatCompletionRequest
from serve_app.http.protocol.chat_images import without_media
from serve_app.http.protocol.completions import CompletionRequest
from serve_app.http.protocol.errors import APIError, bad_request
from serve_app.http.protocol.max_tokens import requested_max_tokens

UNTRUSTED_TEMPLATE = (
    "Chat template is passed with request, but --trust-request-chat-template is not set. "
    "Refused request with untrusted chat template."
)


def _strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value (keys included), depth-first, without recursion limits."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, Mapping):
            for k, item in v.items():
                if isinstance(k, str):
                    yield k
                stack.append(item)
        elif isinstance(v, list):
            stack.extend(v)


def _is_valid_unicode(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_unicode(body: Mapping[str, Any]) -> None:
    """400 naming the top-level field whose text holds a lone surrogate."""
    for field, value in body.items():
        if not all(_is_valid_unicode(s) for s in _strings({field: value})):
            raise bad_request(f"{field}: the text holds invalid Unicode (a lone surrogate code point)", str(field))


def check_chat_template(body: Mapping[str, Any], config: IngressConfig) -> None:
    kwargs = body.get("chat_template_kwargs")
    passed = body.get("chat_template") is not None or (
        isinstance(kwargs, Mapping) and kwargs.get("chat_template") is not None
    )
    if passed and not config.trust_request_chat_template:
        raise bad_request(UNTRUSTED_TEMPLATE, "chat_template")


def prompt_chars(body: Mapping[str, Any], is_chat: bool) -> int:
    """Characters of prompt text: every string inside ``messages`` (chat; media parts, an image's
    URL or data, are not text) or ``prompt``."""
    value = without_media(body.get("messages")) if is_chat else body.get("prompt")
    return sum(len(s) for s in _strings(value))


def check_body(body: Mapping[str, Any], is_chat: bool, config: IngressConfig, max_model_len: int) -> None:
    """The checks on the raw JSON body, before parsing into the request model and tokenizing."""
    check_unicode(body)
    check_chat_template(body, config)
    cap = config.prompt_char_cap(max_model_len)
    chars = prompt_chars(body, is_chat)
    if chars > cap:
        field = "messages" if is_chat else "prompt"
        raise bad_request(
            f"The request's prompt text has {chars} characters, more than the limit of {cap}; "
            "please reduce the length of the input.",
            field,
        )


def check_n(n: int, config: IngressConfig) -> None:
    """The parsed request's ``n`` against ``max_n`` (at most the engine contract's ``MAX_N``)."""
    if n > config.max_n:
        raise bad_request(f"n must be at most {config.max_n}, got {n}", "n")


def cap_max_tokens(
    sampling: Sequence[SamplingParams], req: CompletionRequest | ChatCompletionRequest, config: IngressConfig
) -> list[SamplingParams]:
    """``max_tokens_cap``: an explicit larger request is a 400; without one the cap is the default
    (the room left in the context, if smaller, stays the bound)."""
    cap = config.max_tokens_cap
    if cap is None:
        return list(sampling)
    field, requested = requested_max_tokens(req)
    if requested is not None and requested > cap:
        raise bad_request(f"{field} must be at most {cap} on this server, got {requested}", field)
    return [
        sp if sp.max_tokens is None or sp.max_tokens <= cap else dataclasses.replace(sp, max_tokens=cap)
        for sp in sampling
    ]


class ConcurrencyBound:
    """Slots of ``limit`` engine requests; a request takes all its slots or none."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0

    def try_acquire(self, n: int) -> bool:
        if self.held + n > self.limit:
            return False
        self.held += n
        return True

    def release(self, n: int) -> None:
        self.held -= n
        assert self.held >= 0, "released more slots than were held"

    def check_fan_out(self, n: int, retry_after_s: int) -> None:
        """Take ``n`` more slots for a request already holding one: 400 if it could never fit,
        429 if it does not fit now."""
        if n + 1 > self.limit:
            raise bad_request(
                f"The request asks for {n + 1} engine requests (prompts x n), more than this server's "
                f"limit of {self.limit} at once; send fewer prompts or a smaller n.",
                "n",
            )
        if not self.try_acquire(n):
            raise APIError(429, "Too many requests in flight; retry later.", None, retry_after_s)
