"""A ``MetricsSnapshot`` in Prometheus' text format, written by ``prometheus_client``: the snapshot
becomes a collector of ``CounterMetricFamily`` / ``GaugeMetricFamily`` / ``HistogramMetricFamily``
in a registry of its own, and ``generate_latest`` renders it (what vLLM's ``/metrics`` serves).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from deployments.telemetry.snapshot import Family, MetricsSnapshot

CONTENT_TYPE = CONTENT_TYPE_LATEST


class SnapshotCollector:
    """A ``prometheus_client`` collector yielding a snapshot's families."""

    def __init__(self, snapshot: MetricsSnapshot):
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        for family in self._snapshot.families:
            yield prometheus_family(family)


def prometheus_family(family: Family) -> Metric:
    """``family`` as a ``prometheus_client`` family. Its series may carry different label names;
    the family's label names are their union, a label a series lacks is empty (absent, to
    Prometheus)."""
    names: list[str] = []
    for series in family.series:
        names += [k for k, _ in series.labels if k not in names]
    out: CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily
    if family.kind == "counter":
        out = CounterMetricFamily(family.name, family.documentation, labels=names)
    elif family.kind == "gauge":
        out = GaugeMetricFamily(family.name, family.documentation, labels=names)
    else:
        out = HistogramMetricFamily(family.name, family.documentation, labels=names)
    for series in family.series:
        values = [dict(series.labels).get(k, "") for k in names]
        if isinstance(out, HistogramMetricFamily):
            buckets = [(_le(bound), count) for bound, count in series.buckets]
            out.add_metric(values, buckets, series.value)
            if series.created is not None:  # (add_metric takes no created for a histogram)
                out.add_sample(family.name + "_created", dict(zip(names, values)), series.created)
        elif isinstance(out, CounterMetricFamily):
            out.add_metric(values, series.value, created=series.created)
        else:
            out.add_metric(values, series.value)
    return out


def _le(bound: float) -> str:
    """A bucket bound as Prometheus writes it (``+Inf``, ``0.25``, ``1.0``)."""
    text: str = floatToGoString(bound)  # type: ignore[no-untyped-call]  # (prometheus_client declares no types)
    return text


def render(snapshot: MetricsSnapshot) -> bytes:
    """The snapshot in Prometheus' text format (``CONTENT_TYPE``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    return generate_latest(registry)
