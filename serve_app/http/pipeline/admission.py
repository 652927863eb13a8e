"""The concurrency bound, reject metrics and error mapping of a generation request, in one place.

A request holds one slot while it parses, then one per engine request (prompts x n), taken as a
whole or not at all; a streamed answer releases its slots when its body generator ends. Rejects
are labelled with the served model the request resolved to; before that (or for an unknown name,
which must not become a label value) with the only served model, else "unknown".
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi.responses import Response, StreamingResponse

from accel.contract import InvalidRequestError
from deployments.telemetry.metrics import IngressMetrics
from serve_app.http.json_io import error_response
from serve_app.http.limits import ConcurrencyBound
from serve_app.http.protocol.errors import APIError

logger = logging.getLogger(__name__)


class Admitted:
    """One admitted request's hold: its slots and the label its reject would carry."""

    def __init__(self, admission: Admission, label: str):
        self._admission = admission
        self.label = label
        self.slots = 1

    def resolved(self, model: str) -> None:
        self.label = model

    def take_fan_out(self, num_engine_requests: int) -> None:
        """Hold one slot per engine request: 400 if that could never fit, 429 if not now."""
        bound = self._admission.bound
        bound.check_fan_out(num_engine_requests - 1, self._admission.retry_after_s)
        self.slots = num_engine_requests
        self._admission.update_gauge()


class Admission:
    def __init__(
        self,
        bound: ConcurrencyBound,
        metrics_of: Callable[[], IngressMetrics | None],
        retry_after_s: int,
        default_label: str,
    ):
        self.bound = bound
        self.retry_after_s = retry_after_s
        self._metrics_of = metrics_of  # read per call: tests swap the ingress's metrics
        self._default_label = default_label

    async def serve(
        self,
        work: Callable[[Admitted], Awaitable[Response]],
        render_error: Callable[[APIError], Response] = error_response,
    ) -> Response:
        """``work``'s response, within the bound; its errors as status codes, answered by
        ``render_error`` (the endpoint's error shape)."""
        if not self.bound.try_acquire(1):
            self.reject(self._default_label, 429)
            return render_error(APIError(429, "Too many requests in flight; retry later.", None, self.retry_after_s))
        self.update_gauge()
        held, streaming = Admitted(self, self._default_label), False
        try:
            try:
                response = await work(held)
            except Exception as exc:
                response = render_error(self._error(held.label, exc))
            if isinstance(response, StreamingResponse):
                streaming = True
                response.body_iterator = self._leave_after(response.body_iterator, held.slots)
            return response
        finally:
            if not streaming:  # a stream leaves when its body generator ends
                self.leave(held.slots)

    def _error(self, label: str, exc: Exception) -> APIError:
        if isinstance(exc, APIError):
            err = exc
        elif isinstance(exc, InvalidRequestError):
            err = APIError(400, exc.message, exc.field)
        else:
            # Details go to the log only: a client never sees internal type names or messages.
            logger.error("request failed", exc_info=exc)
            err = APIError(500, "Internal server error; see the server log.")
        self.reject(label, err.status)
        return err

    async def _leave_after(self, body: AsyncIterable[Any], slots: int) -> AsyncIterator[Any]:
        try:
            async for line in body:
                yield line
        finally:
            self.leave(slots)

    def leave(self, slots: int) -> None:
        self.bound.release(slots)
        self.update_gauge()

    def update_gauge(self) -> None:
        metrics = self._metrics_of()
        if metrics is not None:
            metrics.inflight.set(self.bound.held)

    def reject(self, model: str, status: int) -> None:
        metrics = self._metrics_of()
        if metrics is not None:
            metrics.reject(model, status)
