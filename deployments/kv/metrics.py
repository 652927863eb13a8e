"""The KV-connector actor's metrics, over ``ray.util.metrics`` (exported as ``ray_meshserve_kv_*``):
the ``KVMetricsSink`` of the object-store registry plus the shared-memory store's counters, which
the actor's sweeper turns into the same series."""

from __future__ import annotations

from ray.util.metrics import Counter, Gauge, Histogram

from accel.kv_transfer.shm_ledger import LedgerState
from deployments.kv.registry import KVMetricsSink, NullMetrics


class RayKVMetrics:
    """``KVMetricsSink`` over ``ray.util.metrics`` (exported as ``ray_meshserve_kv_*``)."""

    def __init__(self) -> None:
        self._bytes = Counter("meshserve_kv_transfer_bytes", "Bytes of KV committed to the connector")
        self._transfers = Counter("meshserve_kv_transfers", "KV transfers by outcome", tag_keys=("outcome",))
        self._latency = Histogram(
            "meshserve_kv_transfer_latency_seconds",
            "Reserve-to-complete time of a KV transfer",
            boundaries=[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30],
        )
        self._expired = Counter("meshserve_kv_transfer_expired", "KV transfers freed by lease expiry")
        self._recomputes = Counter(
            "meshserve_kv_transfer_recomputes", "Prompts recomputed because a KV transfer failed", tag_keys=("reason",)
        )
        self._bytes_used = Gauge("meshserve_kv_connector_bytes_used", "Bytes held by the KV connector")
        self._num_held = Gauge("meshserve_kv_connector_transfers", "Transfers held by the KV connector")
        self._registry_usage = self._shm_usage = (0, 0)  # (bytes, transfers) of each data path

    def on_commit(self, num_bytes: int) -> None:
        if num_bytes > 0:  # a params-only entry commits 0 bytes; Ray counters refuse inc(0)
            self._bytes.inc(num_bytes)
        self._transfers.inc(1, tags={"outcome": "committed"})

    def on_complete(self, num_bytes: int, latency_s: float) -> None:
        self._transfers.inc(1, tags={"outcome": "completed"})
        self._latency.observe(latency_s)

    def on_expire(self, num_bytes: int) -> None:
        self._expired.inc(1)
        self._transfers.inc(1, tags={"outcome": "expired"})

    def on_reject(self, reason: str) -> None:
        self._transfers.inc(1, tags={"outcome": f"rejected_{reason}"})

    def on_recompute(self, reason: str) -> None:
        self._recomputes.inc(1, tags={"reason": reason})

    def on_usage(self, num_bytes_used: int, num_transfers: int) -> None:
        """The object-store registry's usage; the gauges add this node's shared-memory store's."""
        self._registry_usage = (num_bytes_used, num_transfers)
        self._bytes_used.set(num_bytes_used + self._shm_usage[0])
        self._num_held.set(num_transfers + self._shm_usage[1])

    def on_shm_progress(self, before: LedgerState, after: LedgerState, latencies_s: list[float]) -> None:
        """The shared-memory store's counters moved from ``before`` to ``after`` (sweeper thread)."""
        self._shm_usage = (after.bytes_live, after.num_live)
        self.on_usage(*self._registry_usage)
        if after.bytes_committed > before.bytes_committed:
            self._bytes.inc(after.bytes_committed - before.bytes_committed)
        rejected = (
            after.num_rejected_capacity
            + after.num_rejected_too_large
            - before.num_rejected_capacity
            - before.num_rejected_too_large
        )
        for outcome, n in (
            ("committed", after.num_committed - before.num_committed),
            ("completed", after.num_completed - before.num_completed),
            ("expired", after.num_expired - before.num_expired),
            ("rejected_capacity", rejected),
        ):
            if n > 0:
                self._transfers.inc(n, tags={"outcome": outcome})
        if after.num_expired > before.num_expired:
            self._expired.inc(after.num_expired - before.num_expired)
        for latency_s in latencies_s:
            self._latency.observe(latency_s)


def make_metrics() -> KVMetricsSink:
    """``RayKVMetrics`` inside Ray; a no-op sink elsewhere."""
    try:
        return RayKVMetrics()
    except Exception:  # outside a Ray worker (unit tests construct the class directly)
        return NullMetrics()
