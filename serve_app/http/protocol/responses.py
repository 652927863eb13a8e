"""Engine ``OutputDelta``s -> OpenAI responses and SSE chunks, for completions and chat.

``ChoiceState`` accumulates one choice (one engine request); the renderers read it. Usage
follows vLLM: prompt tokens (and cached prompt tokens) once per prompt, completion tokens
summed over every choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import BaseModel

from accel.contract import OutputDelta, TokenLogprob
from accel.text.tokenizer import TextTokenizer
from serve_app.http.protocol.chat import (
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
    DeltaMessage,
)
from serve_app.http.protocol.common import UsageInfo, make_usage
from serve_app.http.protocol.completions import (
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
)
from serve_app.http.protocol.logprobs import chat_logprobs, completion_logprobs


@dataclass
class ChoiceState:
    index: int
    prompt_index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    num_prompt_tokens: int = 0
    num_completion_tokens: int = 0
    num_cached_tokens: int = 0
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None

    def add(self, delta: OutputDelta) -> None:
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        self.text += delta.text
        self.token_ids.extend(delta.new_token_ids)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        self.num_prompt_tokens = delta.num_prompt_tokens
        self.num_completion_tokens = delta.num_completion_tokens
        self.num_cached_tokens = delta.num_cached_tokens
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason.value
            self.stop_reason = delta.stop_reason


def prompt_logprobs_json(
    tok: TextTokenizer, lps: Sequence[TokenLogprob | None] | None
) -> list[dict[str, dict[str, Any]] | None] | None:
    """vLLM's ``prompt_logprobs`` shape: per prompt token None (the first) or
    ``{token id: {"logprob", "rank", "decoded_token"}}`` for the token and its top alternatives."""
    if lps is None:
        return None
    out: list[dict[str, dict[str, Any]] | None] = []
    for lp in lps:
        if lp is None:
            out.append(None)
            continue
        entries = {}
        for rank, (tid, value) in enumerate(lp.top, start=1):
            entries[str(tid)] = {
                "logprob": value,
                "rank": rank,
                "decoded_token": tok.decode([tid], skip_special_tokens=False),
            }
        entries[str(lp.token_id)] = {
            "logprob": lp.logprob,
            "rank": lp.rank,
            "decoded_token": tok.decode([lp.token_id], skip_special_tokens=False),
        }
        out.append(entries)
    return out


def usage_of(choices: Sequence[ChoiceState]) -> UsageInfo:
    per_prompt: dict[int, ChoiceState] = {}
    for c in choices:
        per_prompt.setdefault(c.prompt_index, c)
    return make_usage(
        sum(c.num_prompt_tokens for c in per_prompt.values()),
        sum(c.num_completion_tokens for c in choices),
        sum(c.num_cached_tokens for c in per_prompt.values()),
    )


@dataclass(frozen=True)
class RenderOptions:
    request_id: str
    created: int
    model: str
    num_logprobs: int | None  # None: no logprobs requested
    return_token_ids: bool
    include_usage: bool
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: usage in every chunk
    num_prompt_tokens: int = 0  # of the (first) prompt: the chat role chunk's continuous usage
    tokens_as_ids: bool = False  # return_tokens_as_token_ids: logprob tokens as "token_id:<id>"
    echo: tuple[str, ...] = ()  # per prompt: what echo prepends to its choices' text (conversion.echo_texts)
    echo_only: bool = False  # max_tokens.echo_only: the generated text is not shown, only the echo

    def echo_of(self, prompt_index: int) -> str:
        return self.echo[prompt_index] if self.echo else ""

    @property
    def is_text_only(self) -> bool:
        """Chunks carry text only (no logprobs, no token ids, no usage): ``fast_text_chunk_sse``
        renders them."""
        return self.num_logprobs is None and not self.return_token_ids and not self.continuous_usage


def _chunk_usage(opts: RenderOptions, delta: OutputDelta) -> UsageInfo | None:
    """vLLM's continuous usage: this choice's prompt and completion tokens so far."""
    if not opts.continuous_usage:
        return None
    n_prompt, n_completion = delta.num_prompt_tokens, delta.num_completion_tokens
    return UsageInfo(prompt_tokens=n_prompt, completion_tokens=n_completion, total_tokens=n_prompt + n_completion)


def completion_response(
    opts: RenderOptions, tok: TextTokenizer, choices: Sequence[ChoiceState], prompts: Sequence[Sequence[int]]
) -> CompletionResponse:
    out = []
    for c in choices:
        lps = (
            completion_logprobs(tok, c.logprobs, opts.num_logprobs, 0, opts.tokens_as_ids)
            if opts.num_logprobs is not None
            else None
        )
        out.append(
            CompletionResponseChoice(
                index=c.index,
                text=opts.echo_of(c.prompt_index) + ("" if opts.echo_only else c.text),
                logprobs=lps,
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
                token_ids=c.token_ids if opts.return_token_ids else None,
                prompt_token_ids=list(prompts[c.prompt_index]) if opts.return_token_ids else None,
                prompt_logprobs=prompt_logprobs_json(tok, c.prompt_logprobs),
            )
        )
    return CompletionResponse(
        id=opts.request_id, created=opts.created, model=opts.model, choices=out, usage=usage_of(choices)
    )


def completion_chunk(
    opts: RenderOptions, tok: TextTokenizer, choice: ChoiceState, delta: OutputDelta, text_offset: int
) -> CompletionStreamResponse:
    lps = None
    if opts.num_logprobs is not None and delta.logprobs:
        # called before ``choice.add(delta)``: its token ids are the ones before this delta
        lps = completion_logprobs(
            tok, delta.logprobs, opts.num_logprobs, text_offset, opts.tokens_as_ids, choice.token_ids
        )
    return CompletionStreamResponse(
        id=opts.request_id,
        created=opts.created,
        model=opts.model,
        choices=[
            CompletionResponseStreamChoice(
                index=choice.index,
                text=delta.text,
                logprobs=lps,
                finish_reason=delta.finish_reason.value if delta.finish_reason else None,
                stop_reason=delta.stop_reason if delta.finish_reason else None,
                token_ids=list(delta.new_token_ids) if opts.return_token_ids else None,
            )
        ],
        usage=_chunk_usage(opts, delta),
    )


def completion_usage_chunk(opts: RenderOptions, choices: Sequence[ChoiceState]) -> CompletionStreamResponse:
    return CompletionStreamResponse(
        id=opts.request_id, created=opts.created, model=opts.model, choices=[], usage=usage_of(choices)
    )


def chat_response(
    opts: RenderOptions, tok: TextTokenizer, choices: Sequence[ChoiceState], prompt: Sequence[int]
) -> ChatCompletionResponse:
    out = []
    for c in choices:
        lps = (
            chat_logprobs(tok, c.logprobs, opts.num_logprobs, opts.tokens_as_ids)
            if opts.num_logprobs is not None
            else None
        )
        out.append(
            ChatCompletionResponseChoice(
                index=c.index,
                message=ChatMessage(role="assistant", content=opts.echo_of(0) + c.text),
                logprobs=lps,
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
                token_ids=c.token_ids if opts.return_token_ids else None,
            )
        )
    return ChatCompletionResponse(
        id=opts.request_id,
        created=opts.created,
        model=opts.model,
        choices=out,
        usage=usage_of(choices),
        prompt_token_ids=list(prompt) if opts.return_token_ids else None,
        prompt_logprobs=prompt_logprobs_json(tok, choices[0].prompt_logprobs) if choices else None,
    )


def chat_role_chunk(opts: RenderOptions, index: int) -> ChatCompletionStreamResponse:
    n = opts.num_prompt_tokens
    return ChatCompletionStreamResponse(
        id=opts.request_id,
        created=opts.created,
        model=opts.model,
        choices=[ChatCompletionResponseStreamChoice(index=index, delta=DeltaMessage(role="assistant", content=""))],
        usage=UsageInfo(prompt_tokens=n, completion_tokens=0, total_tokens=n) if opts.continuous_usage else None,
    )


def chat_echo_chunk(opts: RenderOptions, index: int) -> ChatCompletionStreamResponse:
    n = opts.num_prompt_tokens
    return ChatCompletionStreamResponse(
        id=opts.request_id,
        created=opts.created,
        model=opts.model,
        choices=[ChatCompletionResponseStreamChoice(index=index, delta=DeltaMessage(content=opts.echo_of(0)))],
        usage=UsageInfo(prompt_tokens=n, completion_tokens=0, total_tokens=n) if opts.continuous_usage else None,
    )


def chat_chunk(
    opts: RenderOptions, tok: TextTokenizer, choice: ChoiceState, delta: OutputDelta
) -> ChatCompletionStreamResponse:
    lps = None
    if opts.num_logprobs is not None and delta.logprobs:
        # called after ``choice.add(delta)``: the token ids before this delta are its context
        before = choice.token_ids[: len(choice.token_ids) - len(delta.new_token_ids)]
        lps = chat_logprobs(tok, delta.logprobs, opts.num_logprobs, opts.tokens_as_ids, before)
    return ChatCompletionStreamResponse(
        id=opts.request_id,
        created=opts.created,
        model=opts.model,
        choices=[
            ChatCompletionResponseStreamChoice(
                index=choice.index,
                delta=DeltaMessage(content=delta.text),
                logprobs=lps,
                finish_reason=delta.finish_reason.value if delta.finish_reason else None,
                stop_reason=delta.stop_reason if delta.finish_reason else None,
                token_ids=list(delta.new_token_ids) if opts.return_token_ids else None,
            )
        ],
        usage=_chunk_usage(opts, delta),
    )


def chat_usage_chunk(opts: RenderOptions, choices: Sequence[ChoiceState]) -> ChatCompletionStreamResponse:
    return ChatCompletionStreamResponse(
        id=opts.request_id, created=opts.created, model=opts.model, choices=[], usage=usage_of(choices)
    )


def with_openai_nulls(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` (a response or chunk dumped without None fields) with the fields OpenAI's schema
    requires but allows to be null written as null, as vLLM's server writes them: each
    choice's ``logprobs`` and ``finish_reason`` (a streamed completions choice's
    ``stop_reason`` too), a chat message's ``content``. Clients that test ``finish_reason ===
    null`` (the JavaScript SDK's types) need the key."""
    for choice in body.get("choices", ()):
        choice.setdefault("logprobs", None)
        choice.setdefault("finish_reason", None)
        if "text" in choice or choice["finish_reason"] is not None:
            choice.setdefault("stop_reason", None)
        if "message" in choice:
            choice["message"].setdefault("content", None)
    return body


def sse(payload: BaseModel) -> str:
    body = with_openai_nulls(payload.model_dump(exclude_none=True))
    return f"data: {orjson.dumps(body).decode()}\n\n"


def fast_text_chunk_sse(opts: RenderOptions, index: int, delta: OutputDelta, is_chat: bool) -> str:
    """The common streaming chunk (text only: no logprobs, no token ids) without building
    pydantic models: the per-token hot path. Same JSON as ``sse(completion_chunk(...))`` /
    ``sse(chat_chunk(...))`` for such a delta."""
    choice: dict[str, Any] = {"index": index}
    if is_chat:
        choice["delta"] = {"content": delta.text}
    else:
        choice["text"] = delta.text
    choice["logprobs"] = None
    choice["finish_reason"] = None if delta.finish_reason is None else delta.finish_reason.value
    if not is_chat or delta.finish_reason is not None:
        choice["stop_reason"] = delta.stop_reason if delta.finish_reason is not None else None
    body = {
        "id": opts.request_id,
        "object": "chat.completion.chunk" if is_chat else "text_completion",
        "created": opts.created,
        "model": opts.model,
        "choices": [choice],
    }
    return f"data: {orjson.dumps(body).decode()}\n\n"  # compact UTF-8 JSON, as json.dumps(ensure_ascii=False)


SSE_DONE = "data: [DONE]\n\n"
