"""A typed snapshot of Prometheus metric families, what an engine replica hands the ingress for
``GET /metrics`` (``EngineReplica.metrics_snapshot``): counters, gauges and histograms by name,
each series with its labels and values. Read from a ``prometheus_client`` registry (vLLM's
``PrometheusStatLogger`` registers in the process's ``REGISTRY``; the TT replica keeps its own,
``engine_prometheus``), merged across replicas (``merge``) and rendered by ``prometheus_client``
again (``exposition``): no text format written here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

MetricKind = Literal["counter", "gauge", "histogram"]
Labels = tuple[tuple[str, str], ...]  # sorted by name


@dataclass(frozen=True)
class Series:
    """One labelled series. ``value``: a counter's total, a gauge's value, a histogram's sum.
    ``buckets``: a histogram's (upper bound, cumulative count), ascending, ``inf`` last (its
    count is the histogram's ``_count``). ``created``: a counter's or histogram's ``_created``
    (Unix time it started counting), as ``prometheus_client`` exports it; None without."""

    labels: Labels
    value: float = 0.0
    buckets: tuple[tuple[float, float], ...] = ()
    created: float | None = None

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0

    def label(self, name: str) -> str | None:
        return dict(self.labels).get(name)


@dataclass(frozen=True)
class Family:
    """A metric family: ``name`` as Prometheus names it without suffixes (a counter without
    ``_total``, a histogram without ``_bucket``/``_sum``/``_count``)."""

    name: str
    kind: MetricKind
    documentation: str
    series: tuple[Series, ...]


@dataclass(frozen=True)
class MetricsSnapshot:
    families: tuple[Family, ...] = ()

    def family(self, name: str) -> Family | None:
        return next((f for f in self.families if f.name == name), None)


def labels_of(mapping: Mapping[str, str]) -> Labels:
    return tuple(sorted(mapping.items()))


def family_of(metric: Metric, relabel: Callable[[Labels], Labels] | None = None) -> Family | None:
    """A collected ``prometheus_client`` family as a ``Family`` (None for kinds other than
    counter, gauge and histogram); ``relabel`` rewrites every series' labels."""
    fix = relabel or (lambda labels: labels)
    created = {labels_of(s.labels): float(s.value) for s in metric.samples if s.name == metric.name + "_created"}
    if metric.type in ("counter", "gauge"):
        wanted = metric.name + "_total" if metric.type == "counter" else metric.name
        series = tuple(
            Series(fix(labels_of(s.labels)), float(s.value), created=created.get(labels_of(s.labels)))
            for s in metric.samples
            if s.name == wanted
        )
        return Family(metric.name, metric.type, metric.documentation, series)  # type: ignore[arg-type]
    if metric.type == "histogram":
        return Family(metric.name, "histogram", metric.documentation, _histogram_series(metric, fix, created))
    return None


def _histogram_series(
    metric: Metric, fix: Callable[[Labels], Labels], created: Mapping[Labels, float]
) -> tuple[Series, ...]:
    sums: dict[Labels, float] = {}
    buckets: dict[Labels, list[tuple[float, float]]] = {}
    for s in metric.samples:
        if s.name == metric.name + "_sum":
            sums[labels_of(s.labels)] = float(s.value)
        elif s.name == metric.name + "_bucket":
            rest = labels_of({k: v for k, v in s.labels.items() if k != "le"})
            buckets.setdefault(rest, []).append((float(s.labels["le"]), float(s.value)))
    return tuple(
        Series(fix(labels), sums.get(labels, 0.0), tuple(sorted(bs, key=lambda b: b[0])), created.get(labels))
        for labels, bs in buckets.items()
    )


def registry_snapshot(
    registry: CollectorRegistry, prefix: str | tuple[str, ...], relabel: Callable[[Labels], Labels] | None = None
) -> MetricsSnapshot:
    """The families of ``registry`` whose names start with ``prefix``."""
    families = []
    for metric in registry.collect():
        if metric.name.startswith(prefix):
            family = family_of(metric, relabel)
            if family is not None:
                families.append(family)
    return MetricsSnapshot(tuple(families))


def with_label(name: str, value: str) -> Callable[[Labels], Labels]:
    """A ``relabel`` setting label ``name`` to ``value`` where the series has it (vLLM's
    ``model_name`` is the engine's served name; the ingress serves the config's model name)."""

    def relabel(labels: Labels) -> Labels:
        return tuple((k, value if k == name else v) for k, v in labels)

    return relabel


def bucket_bounds(series: Iterable[Series]) -> tuple[float, ...]:
    """Every upper bound of ``series``' buckets, ascending (``inf`` included)."""
    bounds = {b for s in series for b, _ in s.buckets}
    bounds.add(math.inf)
    return tuple(sorted(bounds))


async def broadcast_snapshots(handle: Any, method_name: str, timeout_s: float) -> list[MetricsSnapshot | BaseException]:
    """``method_name`` (a replica method answering a ``MetricsSnapshot``) on every replica of a
    Serve deployment (``DeploymentHandle.broadcast``). A replica whose call failed answers with its
    exception; past ``timeout_s`` the deployment answers with the ``TimeoutError`` alone (one slow
    replica must not hold ``GET /metrics``)."""
    response = handle.broadcast(method_name)
    try:
        answers: list[MetricsSnapshot | BaseException] = await response.results_async(
            timeout_s=timeout_s, return_exceptions=True
        )
    except TimeoutError as exc:
        return [exc]
    return answers
