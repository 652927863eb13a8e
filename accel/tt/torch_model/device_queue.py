"""The torch program's "device queue": one worker thread that runs submitted forwards in order.

A mesh executes commands in submission order while the host goes on; this is the same on one
thread. ``submit`` returns a ``concurrent.futures.Future``; ``FutureEvent`` is the ``DeviceEvent``
for it (``synchronize()`` waits and re-raises the forward's exception, like a failed device op).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def device_num_threads() -> int:
    """Intra-op threads of the device thread: every core this process may use but one, which is
    left to the host side (the engine's step loop and asyncio), like vLLM's CPU worker, which
    binds its OpenMP threads to all cores but the one reserved for its scheduler process. On a
    loaded machine more OpenMP threads than free cores make each small GEMM wait at barriers."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(torch.get_num_threads(), cores - 1))


class DeviceQueue:
    def __init__(self, name: str = "torch-mesh-device", num_threads: int | None = None) -> None:
        # torch.set_num_threads in the worker sets that thread's OpenMP team size (other threads
        # keep theirs; MKL's own thread count is process-wide).
        threads = device_num_threads() if num_threads is None else num_threads
        self.num_threads = threads
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=name, initializer=torch.set_num_threads, initargs=(threads,)
        )

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        return self._executor.submit(fn)

    def run(self, fn: Callable[[], T]) -> T:
        """Submit and wait: synchronous calls still queue behind in-flight work."""
        return self.submit(fn).result()

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=False)


@dataclass(frozen=True)
class FutureEvent:
    future: Future[Any]

    def synchronize(self) -> None:
        self.future.result()


@dataclass(frozen=True)
class PendingDecode:
    """Handle of a submitted decode (what ``decode_forward(read_from_device=False)`` returns).

    ``future`` resolves to host logits ``[B_wire, vocab]`` or a ``SampledOutput``."""

    future: Future[Any]
    is_sampled: bool

    def result(self) -> Any:
        return self.future.result()
