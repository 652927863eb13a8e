"""The torch program's "device queue": one worker thread that runs submitted forwards in order.

A mesh executes commands in submission order while the host goes on; this is the same on one
thread. ``submit`` returns a ``concurrent.futures.Future``; ``FutureEvent`` is the ``DeviceEvent``
for it (``synchronize()`` waits and re-raises the forward's exception, like a failed device op).
"""

from __future__ import annotations

import os
import time
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
        self._time = DeviceTime(0, 0.0, 0.0)  # replaced (never mutated) by the worker only

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        return self._executor.submit(self._timed, fn)

    def device_time(self) -> DeviceTime:
        return self._time

    def _timed(self, fn: Callable[[], T]) -> T:
        started, started_cpu = time.perf_counter(), time.thread_time()
        try:
            return fn()
        finally:
            t = self._time
            self._time = DeviceTime(
                t.num_programs + 1,
                t.busy_s + time.perf_counter() - started,
                t.busy_cpu_s + time.thread_time() - started_cpu,
            )

    def run(self, fn: Callable[[], T]) -> T:
        """Submit and wait: synchronous calls still queue behind in-flight work."""
        return self.submit(fn).result()

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=False)


@dataclass(frozen=True)
class DeviceTime:
    """Cumulative device-queue accounting (benchmarks read differences of two snapshots).
    ``busy_s``: wall time inside programs; ``busy_cpu_s``: the worker's CPU time in them (the
    rest of ``busy_s`` is the worker waiting for the GIL or for a core)."""

    num_programs: int
    busy_s: float
    busy_cpu_s: float


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
