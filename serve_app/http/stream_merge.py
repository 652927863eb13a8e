"""One API request's engine streams (n > 1, several prompts) interleaved into one, as they produce."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from accel.contract import OutputDelta


class _Done:
    """A stream of ``merge_streams`` ended."""


_DONE = _Done()


async def merge_streams(
    streams: Sequence[AsyncIterator[OutputDelta]],
) -> AsyncGenerator[tuple[int, OutputDelta], None]:
    """Interleave several delta streams as they produce; (stream index, delta). An error in any
    stream ends the merge with that error; leaving early cancels every stream."""
    if len(streams) == 1:
        async for delta in streams[0]:
            yield 0, delta
        return
    queue: asyncio.Queue[tuple[int, OutputDelta | Exception | _Done]] = asyncio.Queue()

    async def pump(i: int, s: AsyncIterator[OutputDelta]) -> None:
        try:
            async for d in s:
                queue.put_nowait((i, d))
        except Exception as exc:
            queue.put_nowait((i, exc))
        finally:
            queue.put_nowait((i, _DONE))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if isinstance(item, _Done):
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
