"""``DeltaCoalescer``: the first token is never held, a lone stream is token-granular, a busy
replica's stream merges the deltas of a window exactly, a finish or an error ends a window at
once. Order of events, not timing: a window of an hour that is observed to be open, and held
consumers."""

from __future__ import annotations

import asyncio

import pytest

from accel.contract import FinishReason, OutputDelta, TokenLogprob
from deployments.replicas.delta_coalescer import DeltaCoalescer, merge_deltas

HOUR_S = 3600.0


def delta(i: int, finish: FinishReason | None = None, stop=None) -> OutputDelta:
    """Token ``i`` of request "r" (cumulative count i + 1), with its logprob."""
    return OutputDelta("r", (i,), f"t{i} ", 4, i + 1, 2, (TokenLogprob(i, -0.1 * i),), finish, stop)


async def is_pending(task: asyncio.Task, turns: int = 20) -> bool:
    """Whether ``task`` is still waiting after the loop ran everything ready ``turns`` times."""
    for _ in range(turns):
        await asyncio.sleep(0)
    return not task.done()


def test_merge_deltas_keeps_the_stream_meaning():
    a = OutputDelta("r", (1,), "a", 3, 1, 0, (TokenLogprob(1, -0.1),))
    b = OutputDelta("r", (2, 3), "bc", 3, 3, 2, (TokenLogprob(2, -0.2), TokenLogprob(3, -0.3)), FinishReason.STOP, "x")
    m = merge_deltas([a, b])
    assert (m.new_token_ids, m.text, m.num_completion_tokens, m.num_cached_tokens) == ((1, 2, 3), "abc", 3, 2)
    assert [lp.token_id for lp in m.logprobs] == [1, 2, 3]
    assert (m.finish_reason, m.stop_reason) == (FinishReason.STOP, "x")
    assert merge_deltas([OutputDelta("r", (1,), "a", 3, 1)]).logprobs is None
    assert merge_deltas([a]) is a


def test_first_delta_is_sent_at_once_even_when_busy():
    async def run():
        c = DeltaCoalescer(HOUR_S, is_busy=lambda: True)
        first = asyncio.ensure_future(c.next())
        assert await is_pending(first)  # nothing produced yet
        c.put(delta(0))
        assert await asyncio.wait_for(first, HOUR_S) == delta(0)  # no window before the first message

    asyncio.run(run())


def test_lone_stream_gets_every_delta_as_its_own_message():
    async def run():
        c = DeltaCoalescer(HOUR_S, is_busy=lambda: False)
        for i in range(5):
            waiting = asyncio.ensure_future(c.next())
            assert await is_pending(waiting)  # the consumer waits for the engine, never for a window
            c.put(delta(i))
            assert await waiting == delta(i)

    asyncio.run(run())


def test_busy_stream_merges_a_window_exactly_and_a_finish_ends_it():
    async def run():
        c = DeltaCoalescer(HOUR_S, is_busy=lambda: True)
        c.put(delta(0))
        assert await c.next() == delta(0)
        held = asyncio.ensure_future(c.next())
        c.put(delta(1))
        c.put(delta(2))
        assert await is_pending(held)  # inside the window: held, not sent
        c.put(delta(3, FinishReason.STOP, "stop!"))
        merged = await asyncio.wait_for(held, HOUR_S)  # the finish is not held
        assert merged == merge_deltas([delta(1), delta(2), delta(3, FinishReason.STOP, "stop!")])
        assert merged.new_token_ids == (1, 2, 3) and merged.text == "t1 t2 t3 "
        assert [lp.token_id for lp in merged.logprobs] == [1, 2, 3]
        assert (merged.num_completion_tokens, merged.finish_reason, merged.stop_reason) == (
            4,
            FinishReason.STOP,
            "stop!",
        )

    asyncio.run(run())


def test_window_ends_by_itself():
    async def run():
        c = DeltaCoalescer(0.001, is_busy=lambda: True)
        c.put(delta(0))
        await c.next()
        c.put(delta(1))
        c.put(delta(2))
        # Not finished: the window's end, not a final delta, sends the merged message.
        assert (await asyncio.wait_for(c.next(), HOUR_S)).new_token_ids == (1, 2)

    asyncio.run(run())


def test_stream_that_stops_being_busy_is_no_longer_held():
    async def run():
        busy = [True]
        c = DeltaCoalescer(HOUR_S, is_busy=lambda: busy[0])
        c.put(delta(0))
        await c.next()
        held = asyncio.ensure_future(c.next())
        c.put(delta(1))
        assert await is_pending(held)
        busy[0] = False  # the other streams ended
        c.put(delta(2))
        assert (await asyncio.wait_for(held, HOUR_S)).new_token_ids == (1, 2)

    asyncio.run(run())


def test_error_ends_the_window_after_the_deltas_before_it():
    async def run():
        c = DeltaCoalescer(HOUR_S, is_busy=lambda: True)
        c.put(delta(0))
        await c.next()
        held = asyncio.ensure_future(c.next())
        c.put(delta(1))
        assert await is_pending(held)
        c.put_error(RuntimeError("engine died"))
        assert (await asyncio.wait_for(held, HOUR_S)).new_token_ids == (1,)
        with pytest.raises(RuntimeError, match="engine died"):
            await c.next()

    asyncio.run(run())


def test_held_consumer_gets_what_piled_up_merged_even_when_not_busy():
    async def run():
        c = DeltaCoalescer(0.0, is_busy=lambda: False)
        for i in range(4):  # the consumer is away (sending the previous message)
            c.put(delta(i))
        merged = await c.next()
        assert merged.new_token_ids == (0, 1, 2, 3) and merged.num_completion_tokens == 4

    asyncio.run(run())
