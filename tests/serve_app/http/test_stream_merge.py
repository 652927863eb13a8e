"""``merge_streams``: one API request's engine streams interleaved as they produce."""

from __future__ import annotations

import asyncio

from serve_app.http.stream_merge import merge_streams
from tests.serve_app.http.engine_doubles import delta


def test_merge_interleaves_and_cancels_on_exit():
    async def gen(tag, n, delay):
        try:
            for i in range(n):
                await asyncio.sleep(delay)
                yield delta(tag, i)
        finally:
            closed.append(tag)

    closed = []

    async def run():
        got = [(i, d.request_id) async for i, d in merge_streams([gen("a", 3, 0.001), gen("b", 2, 0.0015)])]
        assert sorted(got) == [(0, "a")] * 3 + [(1, "b")] * 2
        merged = merge_streams([gen("c", 100, 0.001), gen("d", 100, 0.001)])
        await merged.__anext__()
        await merged.aclose()
        assert {"c", "d"} <= set(closed)

    asyncio.run(run())
