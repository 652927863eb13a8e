"""The KV-connector actor's stats as meshserve:kv_* families: held now as gauges, done so far as
counters by outcome and reason; the host prefix tier only when it is on."""

from __future__ import annotations

from deployments.telemetry.exposition import render
from deployments.telemetry.kv_families import kv_connector_snapshot

REGISTRY_STATS = {
    "num_transfers": 2,
    "num_bytes_used": 4096,
    "capacity_bytes": 1 << 20,
    "num_expired": 1,
    "num_rejected": 3,
    "num_completed": 9,
    "recomputes": {"fetch_failed": 2},
}


def _values(snap, name):
    return {s.labels: s.value for s in snap.family(name).series}


def test_registry_stats_become_gauges_and_counters():
    snap = kv_connector_snapshot({"registry": REGISTRY_STATS})
    assert _values(snap, "meshserve:kv_connector_transfers") == {(): 2.0}
    assert _values(snap, "meshserve:kv_connector_bytes_used") == {(): 4096.0}
    assert _values(snap, "meshserve:kv_transfers") == {
        (("outcome", "completed"),): 9.0,
        (("outcome", "expired"),): 1.0,
        (("outcome", "rejected"),): 3.0,
    }
    assert _values(snap, "meshserve:kv_transfer_recomputes") == {(("reason", "fetch_failed"),): 2.0}
    assert snap.family("meshserve:kv_prefix_tier_hits") is None
    assert b'meshserve:kv_transfers_total{outcome="completed"} 9.0' in render(snap)


def test_the_prefix_tier_when_it_is_on():
    tier = {"num_blocks": 5, "num_bytes_used": 500, "capacity_bytes": 1000, "num_hits": 4, "num_queries": 6}
    snap = kv_connector_snapshot({"registry": REGISTRY_STATS, "prefix_tier": {**tier, "num_evicted": 1}})
    assert _values(snap, "meshserve:kv_prefix_tier_hits") == {(): 4.0}
    assert _values(snap, "meshserve:kv_prefix_tier_queries") == {(): 6.0}
    assert snap.family("meshserve:kv_prefix_tier_hits").kind == "counter"
