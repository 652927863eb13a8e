"""``StepLoop``: the TT engine's step thread, wherever it runs — a thread of ``TTMeshEngine``'s
process (``StepThreadHost``), or the main thread of the engine process (``engine_process.py``).

It owns every piece of scheduling state (the ``EngineCore``); other threads only ``post``
inbox messages and read the published snapshots (``stats``, ``extra_stats``, ``kv_events``,
``last_iteration_at``). Each iteration: apply the inbox, run one engine step (schedule -> execute
-> update, in ``EngineCore.step``), publish, hand the outputs to ``deliver`` (called on this
thread once per iteration that applied messages or gave outputs, possibly with none: the
snapshots changed).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TypeVar

from accel.contract import PrefixCacheChange
from accel.tt.core_messages import AddRequest, FinishRequest, InboxMessage, OutboxMessage, RequestFailed
from accel.tt.engine_core import EngineCore
from accel.tt.grammars import EngineGrammars
from accel.tt.health import DeviceProbe, stalled_problem
from accel.tt.request_state import RequestState

logger = logging.getLogger(__name__)

Deliver = Callable[[Sequence[OutboxMessage]], None]
T = TypeVar("T")


def drain(queue: deque[T]) -> list[T]:
    """Everything in ``queue``, taken from the left while another thread may append."""
    items = []
    while queue:
        items.append(queue.popleft())
    return items


class StepLoop:
    def __init__(self, core: EngineCore, grammars: EngineGrammars, platform: str, deliver: Deliver):
        self.core = core
        self.platform = platform
        self._grammars = grammars
        self._deliver = deliver
        self._cv = threading.Condition()
        self._inbox: deque[InboxMessage] = deque()
        self._stopped = False
        self.kv_events: deque[PrefixCacheChange] = deque()  # drained by take_kv_events
        self.stats = core.stats(platform)
        self.extra_stats = core.step_stats()
        # Step-loop host cost: CPU time of this thread in iterations that ran a step (blocking on
        # the mesh, waiting for the GIL or for a core costs none).
        self.num_busy_iterations = 0
        self.host_busy_s = 0.0
        self.last_iteration_at = time.monotonic()  # heartbeat

    @property
    def is_stopped(self) -> bool:
        return self._stopped

    def num_inflight(self) -> int:
        """Requests the loop holds or has been posted (read-only peeks from any thread)."""
        return len(self.core.requests) + len(self._inbox)

    def take_kv_events(self) -> list[PrefixCacheChange]:
        """The lanes' prefix-cache changes published since the previous call."""
        return drain(self.kv_events)

    def health_problem(self, step_timeout_s: float, device_probe: DeviceProbe | None) -> str | None:
        """Why the loop counts as unhealthy — hung (requests in flight and no iteration within
        ``step_timeout_s``) or the device queue not answering a probe — else None."""
        problem = stalled_problem(
            last_iteration_at=self.last_iteration_at, num_inflight=self.num_inflight(), step_timeout_s=step_timeout_s
        )
        if problem is None and device_probe is not None:
            problem = device_probe.problem()
        return problem

    def post(self, message: InboxMessage) -> None:
        with self._cv:
            self._inbox.append(message)
            self._cv.notify()

    def stop(self) -> None:
        """``run`` returns after its current iteration, aborting what is left."""
        with self._cv:
            self._stopped = True
            self._cv.notify()

    def run(self) -> None:
        """Iterate until ``stop``; then every request still held is aborted (its notice delivered)."""
        while (messages := self._wait_for_work()) is not None:
            started_cpu_s = time.thread_time()
            outputs = [out for message in messages for out in self._apply_safely(message)]
            ran_step = self.core.has_work()
            if ran_step:
                num_steps = self.core.num_steps
                outputs += self._step_safely()
                if not outputs and self.core.num_steps == num_steps:
                    with self._cv:  # nothing could run (waiting on nothing): avoid spinning
                        self._cv.wait(0.001)
            self.kv_events.extend(self.core.take_kv_events())
            self.stats = self.core.stats(self.platform)  # before delivering: a finished stream sees its blocks freed
            self.extra_stats = self.core.step_stats()
            if outputs or messages:  # (a pure wait iteration publishes nothing)
                self._deliver(outputs)
            if ran_step:
                self.num_busy_iterations += 1
                self.host_busy_s += time.thread_time() - started_cpu_s
            self.last_iteration_at = time.monotonic()
        leftover = list(self.core.drain())
        for req_id in list(self.core.requests):
            notice = self.core.abort_request(req_id)
            if notice is not None:
                leftover.append(notice)
        if leftover:
            self._deliver(leftover)

    def _wait_for_work(self) -> list[InboxMessage] | None:
        """The posted messages, once there is anything to do (they, or work in the core); None
        once the loop is stopped."""
        with self._cv:
            while not self._inbox and not self._stopped and not self.core.has_work():
                self._cv.wait()
                self.last_iteration_at = time.monotonic()
            if self._stopped:
                return None
            messages = list(self._inbox)
            self._inbox.clear()
        return messages

    def _apply_safely(self, message: InboxMessage) -> list[OutboxMessage]:
        try:
            return self._apply(message)
        except Exception as exc:  # e.g. a KV import hook failing: fail that request only
            logger.exception("TT mesh engine: %s of %s failed", message.verb, message.req_id)
            error = RuntimeError(f"TT mesh engine could not {message.verb} {message.req_id}: {exc}")
            return [RequestFailed(message.req_id, error)]

    def _apply(self, message: InboxMessage) -> list[OutboxMessage]:
        if isinstance(message, AddRequest):
            r = RequestState.new(message.request, images=message.images)
            if message.request.sampling.has_logit_constraints:
                r.constraint = self._grammars.constraint(message.request, message.grammar)
            self.core.add_request(r)
        elif isinstance(message, FinishRequest):
            self.core.finish_request(message.req_id)
        else:
            notice = self.core.abort_request(message.req_id)
            return [] if notice is None else [notice]
        return []

    def _step_safely(self) -> list[OutboxMessage]:
        try:
            return list(self.core.step())
        except Exception as exc:  # a failed forward must not kill the replica
            logger.exception("TT mesh engine step failed; aborting every request")
            return self._fail_all(exc)

    def _fail_all(self, exc: Exception) -> list[OutboxMessage]:
        failed: list[OutboxMessage] = []
        for req_id in list(self.core.requests):
            self.core.abort_request(req_id)
            failed.append(RequestFailed(req_id, RuntimeError(f"TT mesh engine step failed: {exc}")))
        self.core.queue.reset()
        return failed
