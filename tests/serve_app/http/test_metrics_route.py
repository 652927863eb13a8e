"""``GET /metrics``: every pool's replica snapshots gathered at once, summed per model and engine
index, the ingress's own series after them; a replica that fails or a pool that does not answer
in time is left out and counted."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from accel.contract import FinishReason
from deployments.telemetry.engine_prometheus import EnginePrometheus
from deployments.telemetry.ingress_prometheus import IngressPrometheus
from deployments.telemetry.router_prometheus import RouterPrometheus
from deployments.telemetry.snapshot import MetricsSnapshot
from serve_app.http import metrics_route


class Pool:
    def __init__(self, answers: list[MetricsSnapshot | BaseException], delay_s: float = 0.0):
        self.answers, self.delay_s = answers, delay_s

    async def metrics_snapshots(self, timeout_s: float) -> list[MetricsSnapshot | BaseException]:
        await asyncio.sleep(self.delay_s)
        return self.answers


class NoMetrics:
    """A pool client without snapshots (a test double of another kind)."""


def _replica(prompt: int, output: int, reason: FinishReason) -> MetricsSnapshot:
    prom = EnginePrometheus("tiny", 512)
    prom.observe_finish(reason, prompt, output, 0.5, 0.1)
    return prom.snapshot()


def _samples(body: bytes) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_sums_replicas_across_pools_and_counts_the_ones_that_failed():
    pools = {
        "tt": Pool([_replica(5, 3, FinishReason.STOP), RuntimeError("actor died")]),
        "vllm": Pool([_replica(7, 2, FinishReason.LENGTH)]),
        "slow": Pool([_replica(100, 100, FinishReason.STOP)], delay_s=5.0),
        "other": NoMetrics(),
    }
    ingress = IngressPrometheus()
    ingress.rejected.labels("tiny", "429").inc()
    ingress.failovers.labels("tiny").inc()

    response = asyncio.run(metrics_route.metrics(pools, ingress, inflight=3, timeout_s=0.2))
    assert response.media_type.startswith("text/plain")
    samples = _samples(response.body)
    engine = (("engine", "0"), ("model_name", "tiny"))
    assert samples[("vllm:prompt_tokens_total", engine)] == 12
    assert samples[("vllm:generation_tokens_total", engine)] == 5
    assert (
        samples[("vllm:request_success_total", (("engine", "0"), ("finished_reason", "stop"), ("model_name", "tiny")))]
        == 1
    )
    assert (
        samples[
            ("vllm:request_success_total", (("engine", "0"), ("finished_reason", "length"), ("model_name", "tiny")))
        ]
        == 1
    )
    assert samples[("vllm:e2e_request_latency_seconds_count", engine)] == 2
    replicas = {k[1]: v for k, v in samples.items() if k[0] == "meshserve:metrics_replicas"}
    assert replicas == {
        (("outcome", "ok"), ("pool", "tt")): 1,
        (("outcome", "failed"), ("pool", "tt")): 1,
        (("outcome", "ok"), ("pool", "vllm")): 1,
        (("outcome", "failed"), ("pool", "vllm")): 0,
        (("outcome", "ok"), ("pool", "slow")): 0,
        (("outcome", "failed"), ("pool", "slow")): 1,
    }
    assert samples[("meshserve:ingress_requests_inflight", ())] == 3
    assert samples[("meshserve:requests_rejected_total", (("model_name", "tiny"), ("status", "429")))] == 1
    assert samples[("meshserve:stream_failovers_total", (("model_name", "tiny"),))] == 1


def test_no_pools_still_answers_with_the_ingress_series():
    response = asyncio.run(metrics_route.metrics({}, None, inflight=0))
    assert _samples(response.body) == {("meshserve:ingress_requests_inflight", ()): 0}


def _router(decisions: int, known: int) -> MetricsSnapshot:
    prom = RouterPrometheus()
    prom.decisions.labels("tt", "prefix").inc(decisions)
    prom.known_replicas.labels("tt").set(known)
    return prom.snapshot()


def test_router_replicas_decisions_add_and_the_replicas_they_see_do_not():
    routers = Pool([_router(3, 2), _router(4, 2), RuntimeError("router down")])
    response = asyncio.run(metrics_route.metrics({}, None, inflight=0, router=routers))
    samples = _samples(response.body)
    assert samples[("meshserve:router_decisions_total", (("pool", "tt"), ("reason", "prefix")))] == 7
    assert samples[("meshserve:router_known_replicas", (("pool", "tt"),))] == 2
