"""Sum metric snapshots across replicas into one, what ``GET /metrics`` shows for a model served by
several replicas (pools, engine kinds): series with equal names and labels add up.

- Counters and histograms add (sums, and bucket counts bound by bound). Buckets with different
  bounds (a pool with other custom buckets) merge over the union of bounds, each replica's
  cumulative count read at its largest bound not above it: exact at shared bounds and ``+Inf``.
- A counter's or histogram's ``_created`` is the earliest of the replicas'.
- Gauges add (requests running, waiting), except a fraction (``*_perc``: KV cache usage), which
  is averaged over the replicas reporting it, and a state or info gauge (``*_info``,
  ``vllm:engine_sleep_state``), whose largest value is kept.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from deployments.telemetry.snapshot import Family, Labels, MetricKind, MetricsSnapshot, Series, bucket_bounds

# Gauges every replica reports whole (a state; the engine replicas each router replica sees).
MAX_GAUGES = ("vllm:engine_sleep_state", "meshserve:router_known_replicas")


def gauge_rule(name: str) -> str:
    """How a gauge merges across replicas: ``sum``, ``mean`` or ``max``."""
    if name.endswith("_perc"):
        return "mean"
    if name.endswith("_info") or name in MAX_GAUGES:
        return "max"
    return "sum"


@dataclass
class _Pending:
    kind: MetricKind
    documentation: str
    series: dict[Labels, list[Series]] = field(default_factory=dict)


def merge_snapshots(snapshots: Iterable[MetricsSnapshot]) -> MetricsSnapshot:
    """One snapshot with every family of ``snapshots`` (first seen order); a family whose kind
    differs between snapshots keeps the first kind and drops the others' series."""
    pending: dict[str, _Pending] = {}
    for snapshot in snapshots:
        for family in snapshot.families:
            slot = pending.setdefault(family.name, _Pending(family.kind, family.documentation))
            if slot.kind != family.kind:
                continue
            for series in family.series:
                slot.series.setdefault(series.labels, []).append(series)
    return MetricsSnapshot(
        tuple(
            Family(
                name,
                p.kind,
                p.documentation,
                tuple(_merge_series(name, p.kind, labels, group) for labels, group in p.series.items()),
            )
            for name, p in pending.items()
        )
    )


def _merge_series(name: str, kind: MetricKind, labels: Labels, group: list[Series]) -> Series:
    if kind == "histogram":
        return merge_histograms(labels, group)
    values = [s.value for s in group]
    if kind == "counter":
        return Series(labels, sum(values), created=earliest(group))
    if kind == "gauge":
        rule = gauge_rule(name)
        if rule == "mean":
            return Series(labels, sum(values) / len(values))
        if rule == "max":
            return Series(labels, max(values))
    return Series(labels, sum(values))


def merge_histograms(labels: Labels, group: list[Series]) -> Series:
    bounds = bucket_bounds(group)
    counts = [0.0] * len(bounds)
    for series in group:
        own = [b for b, _ in series.buckets]
        for i, bound in enumerate(bounds):
            at = bisect.bisect_right(own, bound) - 1  # its largest bound <= this one
            if at >= 0:
                counts[i] += series.buckets[at][1]
    return Series(labels, sum(s.value for s in group), tuple(zip(bounds, counts)), earliest(group))


def earliest(group: list[Series]) -> float | None:
    created = [s.created for s in group if s.created is not None]
    return min(created) if created else None
