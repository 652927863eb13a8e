"""``DeltaCoalescer``: one request's engine deltas -> the messages its Serve stream sends.

Every message an engine replica yields is one Ray (gRPC) message to the ingress, one SSE chunk
there and one HTTP write: the per-message cost of three Python processes. Under load (the
replica streams several requests) each stream therefore sends at most one message per
``interval_s``, merging the deltas of the engine steps in between (``merge_deltas``), as
vLLM's ``stream_interval`` does in tokens. The bound is in time so a slow engine step never
waits for more tokens.

Invariants (what the tests check):
- The first message of a stream is sent as soon as its delta exists (no window before it).
- A lone stream (``is_busy()`` false) is token-granular: every delta is its own message, sent
  at once.
- A window never holds a finished delta or an engine error: either ends the window at once.
- Merging keeps text, token ids and logprobs in order and complete; counts, finish and stop
  reasons (and the KV hand-off) come from the last delta (they are cumulative / final).
- Deltas that pile up while the consumer has not asked for the next message (a slow consumer)
  are merged too, whatever ``is_busy()`` says.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from accel.contract import OutputDelta


def merge_deltas(deltas: list[OutputDelta]) -> OutputDelta:
    """Consecutive deltas of one request as one: tokens, text and logprobs concatenated; counts,
    finish and stop reasons from the last (counts are cumulative)."""
    if len(deltas) == 1:
        return deltas[0]
    last = deltas[-1]
    logprobs = None
    if any(d.logprobs is not None for d in deltas):
        logprobs = tuple(lp for d in deltas for lp in (d.logprobs or ()))
    return dataclasses.replace(
        last,
        new_token_ids=tuple(t for d in deltas for t in d.new_token_ids),
        text="".join(d.text for d in deltas),
        logprobs=logprobs,
    )


class DeltaCoalescer:
    """Single producer (``put`` / ``put_error``, on the event loop), single consumer (``next``).

    ``interval_s``: the window after each sent message (0 = never wait, only merge what piled
    up). ``is_busy()``: whether windows apply now (the replica streams more than one request).
    Construct on the event loop that calls ``next`` (windows are in that loop's time).
    """

    def __init__(self, interval_s: float, is_busy: Callable[[], bool]):
        self._interval_s = interval_s
        self._is_busy = is_busy
        self._clock = asyncio.get_running_loop().time
        self._items: list[OutputDelta] = []
        self._error: BaseException | None = None
        self._has_final = False  # a finished delta or an error is queued: no window may hold it
        self._window_end: float | None = None  # None before the first message: no window yet
        self._waiter: asyncio.Future[None] | None = None

    def put(self, delta: OutputDelta) -> None:
        self._items.append(delta)
        if delta.finished:
            self._has_final = True
        self._wake()

    def put_error(self, error: BaseException) -> None:
        self._error = error
        self._has_final = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _is_window_open(self) -> bool:
        if self._has_final or self._window_end is None or self._interval_s <= 0 or not self._is_busy():
            return False
        return self._clock() < self._window_end

    async def next(self) -> OutputDelta:
        """The next message: everything queued, merged. Raises the engine's error (after the
        deltas queued before it have been returned)."""
        while not (self._items or self._error is not None) or self._is_window_open():
            loop = asyncio.get_running_loop()
            self._waiter = loop.create_future()
            timer = None
            if self._items and self._window_end is not None:  # wait out the window, or a final item
                timer = loop.call_at(self._window_end, self._wake)
            try:
                await self._waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        if not self._items:
            assert self._error is not None
            raise self._error
        items, self._items = self._items, []
        self._window_end = self._clock() + self._interval_s
        return merge_deltas(items)
