"""Driver-side Serve handle calls on one event-loop thread.

Handles bind to the loop they are first used in (and need one at all with
RAY_SERVE_THROUGHPUT_OPTIMIZED=1), so every end-to-end test module calls them through the one
session-wide loop, ``HANDLES``."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from typing import Any


class HandleLoop:
    def __init__(self):
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def submit(self, coro: Coroutine) -> asyncio.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine, timeout_s: float = 60) -> Any:
        return self.submit(coro).result(timeout=timeout_s)


HANDLES = HandleLoop()


async def _num_router_replicas(app: str) -> int:
    from ray import serve

    from serve_app.app import ROUTER_NAME

    return len((await serve.get_deployment_handle(ROUTER_NAME, app).snapshot.remote()).replicas)


def wait_until_router_knows(app: str, num_replicas: int, timeout_s: float = 60) -> None:
    """Serve reports an app ready before its router's first poll has seen every engine replica."""
    deadline = time.monotonic() + timeout_s
    while HANDLES.call(_num_router_replicas(app)) < num_replicas:
        assert time.monotonic() < deadline, "the router never saw the engine replicas"
        time.sleep(0.2)
