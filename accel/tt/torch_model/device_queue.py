"""The torch program's "device queue": one worker thread that runs submitted forwards in order.

A mesh executes commands in submission order while the host goes on; this is the same on one
thread. ``submit`` returns a ``concurrent.futures.Future``; ``FutureEvent`` is the ``DeviceEvent``
for it (``synchronize()`` waits and re-raises the forward's exception, like a failed device op).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


class DeviceQueue:
    def __init__(self, name: str = "torch-mesh-device") -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def submit(self, fn: Callable[[], T]) -> "Future[T]":
        return self._executor.submit(fn)

    def run(self, fn: Callable[[], T]) -> T:
        """Submit and wait: synchronous calls still queue behind in-flight work."""
        return self.submit(fn).result()

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=False)


@dataclass(frozen=True)
class FutureEvent:
    future: Future

    def synchronize(self) -> None:
        self.future.result()


@dataclass(frozen=True)
class PendingDecode:
    """Handle of a submitted decode (what ``decode_forward(read_from_device=False)`` returns).

    ``future`` resolves to host logits ``[B_wire, vocab]`` or a ``SampledOutput``."""

    future: Future
    is_sampled: bool

    def result(self) -> Any:
        return self.future.result()
