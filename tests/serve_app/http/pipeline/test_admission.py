"""Admission: slots of the concurrency bound taken and given back however a request ends, and
every error mapped to its status once, with the reject labelled by the resolved model."""

from __future__ import annotations

import asyncio

from fastapi.responses import JSONResponse, Response, StreamingResponse

from accel.contract import InvalidRequestError
from serve_app.http.limits import ConcurrencyBound
from serve_app.http.pipeline.admission import Admission, Admitted
from serve_app.http.protocol.errors import APIError


class Gauge:
    def __init__(self) -> None:
        self.values: list[float] = []

    def set(self, value: float) -> None:
        self.values.append(value)


class Metrics:
    def __init__(self) -> None:
        self.rejects: list[tuple[str, int]] = []
        self.inflight = Gauge()

    def reject(self, model: str, status: int) -> None:
        self.rejects.append((model, status))


def _admission(limit: int = 4) -> tuple[Admission, Metrics]:
    metrics = Metrics()
    return Admission(ConcurrencyBound(limit), lambda: metrics, 7, "default"), metrics  # type: ignore[arg-type,return-value]


def test_a_finished_request_gives_back_every_slot_it_took():
    admission, metrics = _admission()

    async def work(held: Admitted) -> Response:
        held.resolved("m")
        held.take_fan_out(3)
        assert admission.bound.held == 3
        return JSONResponse({})

    response = asyncio.run(admission.serve(work))
    assert response.status_code == 200 and admission.bound.held == 0
    assert metrics.rejects == [] and metrics.inflight.values[-1] == 0


def test_a_stream_holds_its_slots_until_its_body_ends():
    admission, _ = _admission()

    async def lines():
        yield "a"
        yield "b"

    async def work(held: Admitted) -> Response:
        held.take_fan_out(2)
        return StreamingResponse(lines())

    async def run() -> list[str]:
        response = await admission.serve(work)
        assert admission.bound.held == 2  # the body has not been sent yet
        return [line async for line in response.body_iterator]  # type: ignore[attr-defined]

    assert asyncio.run(run()) == ["a", "b"]
    assert admission.bound.held == 0


def test_errors_map_to_statuses_labelled_by_the_resolved_model():
    admission, metrics = _admission()

    def failing(exc: Exception, resolve: bool):
        async def work(held: Admitted) -> Response:
            if resolve:
                held.resolved("tiny")
            raise exc

        return work

    statuses = [
        asyncio.run(admission.serve(failing(APIError(404, "no such model", "model"), False))).status_code,
        asyncio.run(admission.serve(failing(InvalidRequestError("top_p", "out of range"), True))).status_code,
        asyncio.run(admission.serve(failing(RuntimeError("internal detail"), True))).status_code,
    ]
    assert statuses == [404, 400, 500]
    assert metrics.rejects == [("default", 404), ("tiny", 400), ("tiny", 500)]
    assert admission.bound.held == 0


def test_a_full_bound_answers_429_with_retry_after_and_a_fan_out_that_never_fits_400():
    admission, metrics = _admission(limit=2)
    admission.bound.try_acquire(2)

    async def never(held: Admitted) -> Response:
        raise AssertionError("not admitted")

    full = asyncio.run(admission.serve(never))
    assert full.status_code == 429 and full.headers["retry-after"] == "7"
    admission.bound.release(2)

    async def too_wide(held: Admitted) -> Response:
        held.take_fan_out(3)
        return JSONResponse({})

    assert asyncio.run(admission.serve(too_wide)).status_code == 400
    assert metrics.rejects == [("default", 429), ("default", 400)] and admission.bound.held == 0
