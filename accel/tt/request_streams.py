"""``RequestStreams``: the asyncio side of a TT engine — one queue per running request, fed by
the step loop's outputs (``deliver``, from any thread), read by the request's ``stream``
coroutine, which turns token ids into deltas with the shared ``OutputBuilder`` (detokenization,
stop strings, eos, max_tokens, max_model_len) so that work stays off the step loop.

``TTMeshEngine`` owns it whichever host runs the step loop (``StepThreadHost``: a thread of
this process; ``EngineProcessHost``: the engine process); ``post`` sends an inbox message to
wherever the loop runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from accel.contract import FinishReason, GenerateRequest, InvalidRequestError, OutputDelta
from accel.text.output_builder import OutputBuilder
from accel.text.tokenizer import TextTokenizer
from accel.tt.core_messages import (
    AbortRequest,
    AddRequest,
    FinishRequest,
    InboxMessage,
    OutboxMessage,
    RequestFailed,
    put_all,
    take_pending,
)


class RequestStreams:
    def __init__(self, tokenizer: TextTokenizer, max_model_len: int, post: Callable[[InboxMessage], None]):
        self._tokenizer = tokenizer
        self._max_model_len = max_model_len
        self._post = post
        self._lock = threading.Lock()
        self._sinks: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[OutboxMessage]]] = {}
        self._closed: str | None = None  # why new requests are refused

    def __len__(self) -> int:
        return len(self._sinks)

    def close(self, reason: str) -> None:
        """Refuse new requests from now on (``RuntimeError(reason)``)."""
        with self._lock:
            self._closed = reason

    async def stream(
        self, request: GenerateRequest, grammar: Any = None, images: tuple[Any, ...] = ()
    ) -> AsyncIterator[OutputDelta]:
        """Post ``request`` (validated) and stream its deltas; the last one has ``finish_reason``
        set. Leaving the iteration early (client gone) aborts the request, which frees its blocks.
        A stop the builder sees is posted back (``FinishRequest``)."""
        req_id = request.request_id
        queue: asyncio.Queue[OutboxMessage] = asyncio.Queue()
        with self._lock:
            if self._closed is not None:
                raise RuntimeError(self._closed)
            if req_id in self._sinks:
                raise InvalidRequestError("request_id", f"{req_id!r} is already running")
            self._sinks[req_id] = (asyncio.get_running_loop(), queue)
        builder = OutputBuilder(request, self._tokenizer.fast, self._tokenizer.eos_token_ids, self._max_model_len)
        self._post(AddRequest(request, grammar, images))
        try:
            while not builder.finished:
                news = take_pending(await queue.get(), queue)  # raises the error of a RequestFailed
                builder.num_cached_tokens = news.num_cached_tokens
                if news.token_ids:
                    delta = builder.add_tokens(news.token_ids, news.logprobs, kv_transfer=news.kv_transfer)
                    if delta.finished:
                        self._post(FinishRequest(req_id))  # a no-op when the engine already stopped it
                    yield delta
                if news.is_aborted and not builder.finished:
                    yield builder.finish(FinishReason.ABORT)
        finally:
            if not builder.finished:
                self._post(AbortRequest(req_id))
            with self._lock:
                self._sinks.pop(req_id, None)

    def deliver(self, messages: Sequence[OutboxMessage]) -> None:
        """Hand each message to its request's asyncio queue, one ``call_soon_threadsafe`` per
        event loop per call (any thread)."""
        if not messages:
            return
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[OutboxMessage], OutboxMessage]]] = {}
        with self._lock:
            for message in messages:
                sink = self._sinks.get(message.req_id)
                if sink is not None:
                    by_loop.setdefault(sink[0], []).append((sink[1], message))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(put_all, batch)
            except RuntimeError:  # that event loop is closed; its requests are gone
                pass

    def fail_all(self, error: Exception) -> None:
        """End every open stream with ``error`` (the step loop is gone)."""
        with self._lock:
            ids = list(self._sinks)
        self.deliver([RequestFailed(req_id, error) for req_id in ids])
