"""What makes a TT mesh engine unhealthy (``TTMeshEngine.check_health``), as pure bookkeeping.

Three checks, each able to fail: the step thread is alive; while requests are in flight its loop
has completed an iteration within ``step_timeout_s`` (a step stuck in a forward, or a loop that
stopped turning, leaves requests hanging); and the device queue answers: a probe (the torch
program's ``device_ping``, ``ttnn.synchronize_device`` on a mesh) started from a check must
return within ``step_timeout_s``. Probes never block a check: one runs at a time on its own
daemon thread and a later check reads how long it has been running (a hung device would hang
the caller forever).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, cast

logger = logging.getLogger(__name__)

DEFAULT_STEP_TIMEOUT_S = 120.0


class EngineUnhealthy(RuntimeError):
    """A failed health check: the message says which check and for how long."""


class DeviceProbe:
    """At most one ``probe()`` in flight; ``problem()`` starts one when none runs and reports
    the in-flight one once it has run longer than ``timeout_s`` (or the last one's exception)."""

    def __init__(self, probe: Callable[[], None], timeout_s: float, clock: Callable[[], float] = time.monotonic):
        self._probe = probe
        self.timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._started_at: float | None = None  # of the in-flight probe
        self._error: BaseException | None = None  # of the last finished probe

    def problem(self) -> str | None:
        with self._lock:
            if self._error is not None:
                error, self._error = self._error, None
                return f"the device probe failed: {type(error).__name__}: {error}"
            if self._started_at is not None:
                running = self._clock() - self._started_at
                if running > self.timeout_s:
                    return f"the device queue has not answered a probe for {running:.1f} s"
                return None
            self._started_at = self._clock()
        threading.Thread(target=self._run, name="tt-device-probe", daemon=True).start()
        return None

    def _run(self) -> None:
        error: BaseException | None = None
        try:
            self._probe()
        except BaseException as exc:  # reported by the next check
            error = exc
        with self._lock:
            self._started_at = None
            self._error = error


def stalled_problem(
    *, last_iteration_at: float, num_inflight: int, step_timeout_s: float, now: float | None = None
) -> str | None:
    """Why the step loop counts as hung: requests in flight and no completed loop iteration for
    longer than ``step_timeout_s``."""
    if num_inflight <= 0:
        return None
    age = (time.monotonic() if now is None else now) - last_iteration_at
    if age <= step_timeout_s:
        return None
    return (
        f"the engine step loop has not completed an iteration for {age:.1f} s while "
        f"{num_inflight} request(s) are in flight (step_timeout_s {step_timeout_s:g})"
    )


def device_probe(model: Any, backend: Any) -> Callable[[], None] | None:
    """What answers once the device queue has run everything before it: the model's
    ``device_ping`` (the torch programs), else ``ttnn.synchronize_device`` on an opened mesh."""
    ping = getattr(model, "device_ping", None)
    if ping is not None:
        return cast("Callable[[], None]", ping)
    if getattr(backend, "kind", None) == "ttnn" and backend.mesh_device is not None:
        ttnn, mesh_device = backend.ttnn, backend.mesh_device
        return lambda: ttnn.synchronize_device(device=mesh_device)
    return None
