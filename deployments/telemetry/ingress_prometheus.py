"""The ingress's own ``meshserve:*`` series for ``GET /metrics`` on the API port, in a
``prometheus_client`` registry of the ingress replica: the counters ``metrics.IngressMetrics``
also sends to Ray (requests refused before any engine, router fallbacks, stream failovers),
plus what the ingress knows at scrape time (requests it holds, engine replicas that answered the
scrape: ``scrape_families``).
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter

from deployments.telemetry.snapshot import Family, MetricsSnapshot, Series, labels_of, registry_snapshot


class IngressPrometheus:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.rejected = Counter(
            "meshserve:requests_rejected",
            "Requests refused before any engine, by model and status.",
            ["model_name", "status"],
            registry=self.registry,
        )
        self.router_fallbacks = Counter(
            "meshserve:router_fallbacks",
            "Requests routed locally because the router did not answer.",
            ["reason"],
            registry=self.registry,
        )
        self.failovers = Counter(
            "meshserve:stream_failovers",
            "Streams continued on another replica after theirs died mid-stream, by model.",
            ["model_name"],
            registry=self.registry,
        )

    def snapshot(self) -> MetricsSnapshot:
        return registry_snapshot(self.registry, "meshserve:")


def scrape_families(inflight: int, answered: Mapping[str, tuple[int, int]]) -> MetricsSnapshot:
    """``meshserve:ingress_requests_inflight`` (engine requests this ingress replica holds) and
    ``meshserve:metrics_replicas`` (per pool, the engine replicas whose snapshot this scrape got,
    ``outcome="ok"``, or did not, ``outcome="failed"``: dead, or past the timeout)."""
    replicas = tuple(
        Series(labels_of({"pool": pool, "outcome": outcome}), float(n))
        for pool, (ok, failed) in answered.items()
        for outcome, n in (("ok", ok), ("failed", failed))
    )
    return MetricsSnapshot(
        (
            Family(
                "meshserve:ingress_requests_inflight",
                "gauge",
                "Engine requests held by this ingress replica.",
                (Series((), float(inflight)),),
            ),
            Family("meshserve:metrics_replicas", "gauge", "Engine replicas that answered this scrape.", replicas),
        )
    )
