"""RouterMetrics counts a decision and the replicas it sees once for Ray and once in the
``meshserve:router_*`` series of its ``prometheus_client`` registry (``GET /metrics``)."""

from __future__ import annotations

from deployments.telemetry.metrics import RouterMetrics


def test_decisions_and_known_replicas_reach_the_snapshot():
    metrics = RouterMetrics()
    metrics.decided("tt", "prefix")
    metrics.decided("tt", "prefix")
    metrics.decided("vllm", "load")
    metrics.sees("tt", 2)
    metrics.sees("tt", 3)
    snap = metrics.prom.snapshot()
    decisions = {
        (s.label("pool"), s.label("reason")): s.value for s in snap.family("meshserve:router_decisions").series
    }
    assert decisions == {("tt", "prefix"): 2.0, ("vllm", "load"): 1.0}
    (known,) = snap.family("meshserve:router_known_replicas").series
    assert (known.label("pool"), known.value) == ("tt", 3.0)
