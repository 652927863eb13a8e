"""A router replica's ``meshserve:*`` series for the ingress's ``GET /metrics``, in a
``prometheus_client`` registry of its own: the decisions it made (by pool and reason) and the
engine replicas it sees per pool, the counts ``metrics.RouterMetrics`` also sends to Ray. The
ingress sums decisions over router replicas; each router replica sees every engine replica, so
``meshserve:router_known_replicas`` merges by its largest value (``merge.MAX_GAUGES``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from deployments.telemetry.snapshot import MetricsSnapshot, registry_snapshot


class RouterPrometheus:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.decisions = Counter(
            "meshserve:router_decisions",
            "Routing decisions by pool and reason.",
            ["pool", "reason"],
            registry=self.registry,
        )
        self.known_replicas = Gauge(
            "meshserve:router_known_replicas", "Engine replicas the router sees.", ["pool"], registry=self.registry
        )

    def snapshot(self) -> MetricsSnapshot:
        return registry_snapshot(self.registry, "meshserve:")
