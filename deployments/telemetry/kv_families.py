"""The KV-connector actor's ``stats()`` (one per app, prefill/decode only) as ``meshserve:kv_*``
series for the ingress's ``GET /metrics``: what it holds now (gauges), what it has done since it
started (counters: transfers by outcome, prompts recomputed by reason, the host prefix tier's
block hits, queries and evictions). The same quantities ``deployments.kv.metrics`` sends to Ray
(``meshserve_kv_*``); read from the stats dict, so this module needs nothing of ``deployments.kv``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deployments.telemetry.snapshot import Family, MetricsSnapshot, Series, labels_of


def _one(name: str, kind: str, doc: str, value: Any) -> Family:
    return Family(name, kind, doc, (Series((), float(value)),))  # type: ignore[arg-type]


def _by(name: str, doc: str, label: str, values: Mapping[str, Any]) -> Family:
    return Family(name, "counter", doc, tuple(Series(labels_of({label: k}), float(v)) for k, v in values.items()))


def kv_connector_snapshot(stats: Mapping[str, Any]) -> MetricsSnapshot:
    """``KVConnectorActor.stats()`` (``registry``: object store and shared memory together;
    ``prefix_tier`` when the host prefix tier is on) as metric families."""
    reg = stats.get("registry", {})
    families = [
        _one("meshserve:kv_connector_transfers", "gauge", "Transfers held by the KV connector.", reg["num_transfers"]),
        _one("meshserve:kv_connector_bytes_used", "gauge", "Bytes held by the KV connector.", reg["num_bytes_used"]),
        _one("meshserve:kv_connector_capacity_bytes", "gauge", "The KV connector's capacity.", reg["capacity_bytes"]),
        _by(
            "meshserve:kv_transfers",
            "KV transfers by outcome.",
            "outcome",
            {"completed": reg["num_completed"], "expired": reg["num_expired"], "rejected": reg["num_rejected"]},
        ),
        _by(
            "meshserve:kv_transfer_recomputes",
            "Prompts recomputed because a KV transfer failed.",
            "reason",
            reg.get("recomputes", {}),
        ),
    ]
    tier = stats.get("prefix_tier")
    if tier is not None:
        families += [
            _one("meshserve:kv_prefix_tier_blocks", "gauge", "Blocks in the host prefix tier.", tier["num_blocks"]),
            _one(
                "meshserve:kv_prefix_tier_bytes_used", "gauge", "Bytes in the host prefix tier.", tier["num_bytes_used"]
            ),
            _one("meshserve:kv_prefix_tier_hits", "counter", "Host prefix tier blocks served.", tier["num_hits"]),
            _one(
                "meshserve:kv_prefix_tier_queries", "counter", "Host prefix tier blocks asked for.", tier["num_queries"]
            ),
            _one(
                "meshserve:kv_prefix_tier_evicted", "counter", "Host prefix tier blocks evicted.", tier["num_evicted"]
            ),
        ]
    return MetricsSnapshot(tuple(families))
