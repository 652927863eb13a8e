"""``broadcast_snapshots``: every replica's metrics snapshot, a failed replica as its exception, a
deployment past the timeout as the ``TimeoutError`` alone. The handle double is written from Ray
Serve 2.60's ``DeploymentHandle.broadcast(method_name, *args)`` and
``DeploymentBroadcastResponse.results_async(*, timeout_s, return_exceptions)`` (which raises
``TimeoutError`` past ``timeout_s``)."""

from __future__ import annotations

import asyncio

from deployments.telemetry.snapshot import MetricsSnapshot, broadcast_snapshots


class _Response:
    def __init__(self, answers: list[object], delay_s: float):
        self._answers, self._delay_s = answers, delay_s

    async def results_async(self, *, timeout_s: float | None = None, return_exceptions: bool = False) -> list[object]:
        assert return_exceptions
        if timeout_s is not None and self._delay_s > timeout_s:
            raise TimeoutError("Timed out waiting for broadcast results.")
        return self._answers


class _Handle:
    def __init__(self, answers: list[object], delay_s: float = 0.0):
        self._answers, self._delay_s = answers, delay_s
        self.called: list[str] = []

    def broadcast(self, method_name: str, *args: object) -> _Response:
        self.called.append(method_name)
        return _Response(self._answers, self._delay_s)


def test_each_replica_answers_its_snapshot_or_its_exception():
    snapshot, failed = MetricsSnapshot(()), RuntimeError("replica gone")
    handle = _Handle([snapshot, failed])
    assert asyncio.run(broadcast_snapshots(handle, "metrics_snapshot", 1.0)) == [snapshot, failed]
    assert handle.called == ["metrics_snapshot"]


def test_a_deployment_past_the_timeout_answers_the_timeout_alone():
    [answer] = asyncio.run(broadcast_snapshots(_Handle([MetricsSnapshot(())], delay_s=5.0), "metrics_snapshot", 0.1))
    assert isinstance(answer, TimeoutError)
