"""A request's merged engine deltas -> its HTTP body: the whole response (``collect``) or the SSE
stream of chunks (``completion_sse`` / ``chat_sse``), per choice state in ``rsp.ChoiceState``.

The per-token hot path: a text-only request (no logprobs, token ids or continuous usage, no
output parser) renders each delta with ``rsp.fast_text_chunk_sse`` (no pydantic models); output
parsers run only for choices whose model and request have one (``ChoiceParser.active``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, Callable, Sequence

from pydantic import BaseModel

from accel.contract import OutputDelta
from accel.text.tokenizer import TextTokenizer
from serve_app.http.protocol import responses as rsp
from serve_app.http.protocol.errors import APIError
from serve_app.http.protocol.tool_output import ChoiceParser, apply_parsed_messages, parsed_chat_chunk

Merged = AsyncGenerator[tuple[int, OutputDelta], None]  # merge_streams: (choice index, delta)


async def collect(
    merged: Merged,
    choices: list[rsp.ChoiceState],
    opts: rsp.RenderOptions,
    tok: TextTokenizer,
    prompts: Sequence[tuple[int, ...]],
    is_chat: bool,
    parsers: list[ChoiceParser] | None = None,
) -> BaseModel:
    """The non-streaming response once every choice finished."""
    try:
        async for i, delta in merged:
            choices[i].add(delta)
    finally:
        await merged.aclose()
    body: BaseModel
    if is_chat:
        body = rsp.chat_response(opts, tok, choices, prompts[0])
        if parsers is not None:
            apply_parsed_messages(body, choices, parsers)
    else:
        body = rsp.completion_response(opts, tok, choices, prompts)
    return body


async def completion_sse(
    merged: Merged,
    first: tuple[int, OutputDelta] | None,
    choices: list[rsp.ChoiceState],
    opts: rsp.RenderOptions,
    tok: TextTokenizer,
) -> AsyncGenerator[str, None]:
    offsets = [0] * len(choices)
    echoed = [not opts.echo_of(c.prompt_index) for c in choices]

    def render(i: int, delta: OutputDelta) -> str | None:
        if opts.echo_only:
            delta = dataclasses.replace(delta, text="")
        if not echoed[i]:  # echo: the prompt comes with a choice's first chunk, as vLLM sends it
            echoed[i] = True
            delta = dataclasses.replace(delta, text=opts.echo_of(choices[i].prompt_index) + delta.text)
        if opts.is_text_only:
            chunk = rsp.fast_text_chunk_sse(opts, choices[i].index, delta, is_chat=False)
            choices[i].add(delta)
            return chunk
        completion = rsp.completion_chunk(opts, tok, choices[i], delta, offsets[i])
        choices[i].add(delta)
        offsets[i] += len(delta.text)
        return rsp.sse(completion)

    async for line in sse_body(merged, first, render):
        yield line
    if opts.include_usage:
        yield rsp.sse(rsp.completion_usage_chunk(opts, choices))
    yield rsp.SSE_DONE


async def chat_sse(
    merged: Merged,
    first: tuple[int, OutputDelta] | None,
    choices: list[rsp.ChoiceState],
    opts: rsp.RenderOptions,
    tok: TextTokenizer,
    parsers: list[ChoiceParser] | None = None,
) -> AsyncGenerator[str, None]:
    for c in choices:
        yield rsp.sse(rsp.chat_role_chunk(opts, c.index))
    if opts.echo_of(0):  # echo: the continued message's content, once per choice (vLLM)
        for c in choices:
            yield rsp.sse(rsp.chat_echo_chunk(opts, c.index))

    def render(i: int, delta: OutputDelta) -> str | None:
        choices[i].add(delta)
        if parsers is not None and parsers[i].active:
            chunk = parsed_chat_chunk(opts, tok, choices[i], delta, parsers[i])
            return rsp.sse(chunk) if chunk is not None else None
        # As vLLM's chat stream without a parser: a chunk per delta that carries tokens, even when
        # its text is "" (a token ending inside a UTF-8 character, text a stop string holds back),
        # so every token's logprobs and ids reach the client.
        if not delta.text and not delta.new_token_ids and not delta.finished:
            return None
        if opts.is_text_only:
            return rsp.fast_text_chunk_sse(opts, choices[i].index, delta, is_chat=True)
        return rsp.sse(rsp.chat_chunk(opts, tok, choices[i], delta))

    async for line in sse_body(merged, first, render):
        yield line
    if opts.include_usage:
        yield rsp.sse(rsp.chat_usage_chunk(opts, choices))
    yield rsp.SSE_DONE


async def sse_body(
    merged: Merged, first: tuple[int, OutputDelta] | None, render: Callable[[int, OutputDelta], str | None]
) -> AsyncGenerator[str, None]:
    """Render the first delta and the rest; an error mid-stream becomes an error event (the
    200 status is already sent), as vLLM does."""
    try:
        if first is not None:
            line = render(*first)
            if line:
                yield line
        async for i, delta in merged:
            line = render(i, delta)
            if line:
                yield line
    except APIError as err:
        yield f"data: {err.to_response().model_dump_json()}\n\n"
    finally:
        await merged.aclose()
