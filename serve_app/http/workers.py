"""The ingress's worker threads: chat templates, tokenizing and prefix hashing run here, off the
event loop, so a long prompt never stalls other requests (or /health). A bounded pool (the
tokenizers' Rust code releases the GIL): a flood of long prompts queues instead of spawning
threads."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

_T = TypeVar("_T")
_WORKERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ingress-tokenize")


async def in_worker(fn: Callable[..., _T], *args: Any) -> _T:
    return await asyncio.get_running_loop().run_in_executor(_WORKERS, functools.partial(fn, *args))
