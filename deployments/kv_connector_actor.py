"""The KV-connector actor: one per application, where prefill replicas leave a prompt's KV and
decode replicas pick it up.

Data path: the producer ``ray.put``s the canonical payload (one copy into the node's shared object
store) and hands the actor the ``ObjectRef``; the producer then drops its own reference, so the
actor's borrowed reference alone keeps the payload alive and dropping it (completion or lease
expiry) frees it. Consumers read it zero-copy. Only refs and descriptors pass through the actor,
never payload bytes. Ray >= 2.56 removed ``ray.put(_owner=...)``, so the producer process stays
the object's owner: if it dies before the decode side reads, the read fails and the decode side
recomputes the prompt (the same fallback as an expired lease or a dead actor). Logic lives in the
Ray-free ``KVRegistry`` / ``KVPrefixTier``; this module adds naming, a lease sweeper and
``ray.util.metrics``.

Addressing: a named detached actor ``kv_connector`` in namespace ``meshserve-kv-<app>``, so any
process of the cluster — a Serve replica, or a vLLM engine-core/worker child that joined the
cluster with ``ray.init(address="auto")`` — finds it by name. Created idempotently by
``get_or_create_kv_connector``; ``kill_kv_connector`` removes it with the application.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, dataclass
from typing import Any

from accel.block_hash import BlockHash
from accel.kv_transfer.payload import KVDescriptor
from deployments.kv_prefix_tier import KVPrefixTier
from deployments.kv_registry import KVRegistry

logger = logging.getLogger(__name__)

ACTOR_NAME = "kv_connector"
SWEEP_PERIOD_S = 1.0


@dataclass(frozen=True)
class KVConnectorConfig:
    capacity_bytes: int = 1 << 30
    lease_s: float = 30.0
    prefix_tier_bytes: int = 0  # 0 = no prefix tier

    def __post_init__(self) -> None:
        if self.capacity_bytes <= 0 or self.lease_s <= 0 or self.prefix_tier_bytes < 0:
            raise ValueError(f"invalid KV connector config {self}")


def actor_namespace(app_name: str) -> str:
    return f"meshserve-kv-{app_name}"


class RayKVMetrics:
    """``KVMetricsSink`` over ``ray.util.metrics`` (exported as ``ray_meshserve_kv_*``)."""

    def __init__(self) -> None:
        from ray.util import metrics

        self._bytes = metrics.Counter("meshserve_kv_transfer_bytes", "Bytes of KV committed to the connector")
        self._transfers = metrics.Counter("meshserve_kv_transfers", "KV transfers by outcome",
                                          tag_keys=("outcome",))
        self._latency = metrics.Histogram("meshserve_kv_transfer_latency_seconds",
                                          "Reserve-to-complete time of a KV transfer",
                                          boundaries=[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30])
        self._expired = metrics.Counter("meshserve_kv_transfer_expired", "KV transfers freed by lease expiry")
        self._recomputes = metrics.Counter("meshserve_kv_transfer_recomputes",
                                           "Prompts recomputed because a KV transfer failed",
                                           tag_keys=("reason",))
        self._bytes_used = metrics.Gauge("meshserve_kv_connector_bytes_used", "Bytes held by the KV connector")
        self._num_held = metrics.Gauge("meshserve_kv_connector_transfers", "Transfers held by the KV connector")

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
        self._bytes_used.set(num_bytes_used)
        self._num_held.set(num_transfers)


class KVConnectorActor:
    """Async Ray actor. Payload arguments are ``[ObjectRef]`` (a list, so Ray passes the reference
    instead of resolving it); errors are ``accel.kv_transfer.transport`` exceptions."""

    def __init__(self, config: KVConnectorConfig):
        self._config = config
        self._registry = KVRegistry(config.capacity_bytes, config.lease_s, metrics=_make_metrics())
        self._tier = KVPrefixTier(config.prefix_tier_bytes) if config.prefix_tier_bytes else None
        self._sweeper: asyncio.Task | None = None

    async def reserve(self, transfer_id: str, num_bytes: int, timeout_s: float) -> None:
        self._ensure_sweeper()
        await self._registry.reserve(transfer_id, num_bytes, timeout_s)

    async def store(self, transfer_id: str, descriptor: KVDescriptor, payload_refs: list,
                    timeout_s: float) -> float:
        """``reserve`` + ``commit`` in one round trip (the payload is already in the object store;
        if it does not fit in time the put fails and the producer's reference frees it)."""
        await self.reserve(transfer_id, descriptor.num_bytes, timeout_s)
        return self._registry.commit(transfer_id, descriptor, payload_refs[0])

    async def commit(self, transfer_id: str, descriptor: KVDescriptor, payload_refs: list) -> float:
        return self._registry.commit(transfer_id, descriptor, payload_refs[0])

    async def cancel(self, transfer_id: str) -> None:
        self._registry.cancel(transfer_id)

    async def claim(self, transfer_id: str) -> tuple[KVDescriptor, list]:
        descriptor, ref = self._registry.claim(transfer_id)
        return descriptor, [ref]

    async def complete(self, transfer_id: str) -> None:
        self._registry.complete(transfer_id)

    async def contains(self, transfer_id: str) -> bool:
        return self._registry.contains(transfer_id)

    async def put_params(self, transfer_id: str, params: dict[str, Any]) -> float:
        """An engine-native connector's ``kv_transfer_params`` (TPU PD: this actor is only the
        control plane pairing prefill and decode); see ``KVRegistry.put_params``."""
        self._ensure_sweeper()
        return self._registry.put_params(transfer_id, params)

    async def claim_params(self, transfer_id: str) -> dict[str, Any]:
        return self._registry.claim_params(transfer_id)

    async def report_recompute(self, reason: str) -> None:
        self._registry.report_recompute(reason)

    async def offer_prefix(self, fingerprint: str, block_size: int, hashes: list[BlockHash],
                           block_refs: list, num_bytes_per_block: int) -> int:
        if self._tier is None:
            return 0
        return self._tier.offer(fingerprint, block_size, hashes, block_refs, num_bytes_per_block)

    async def match_prefix(self, fingerprint: str, block_size: int, hashes: list[BlockHash]) -> list:
        return [] if self._tier is None else self._tier.match(fingerprint, block_size, hashes)

    async def stats(self) -> dict[str, Any]:
        out = {"registry": asdict(self._registry.stats())}
        if self._tier is not None:
            out["prefix_tier"] = asdict(self._tier.stats())
        return out

    def _ensure_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_PERIOD_S)
            expired = self._registry.expire()
            if expired:
                logger.info("KV connector: %d transfer lease(s) expired and were freed", len(expired))


def _make_metrics():
    try:
        return RayKVMetrics()
    except Exception:  # outside a Ray worker (unit tests construct the class directly)
        from deployments.kv_registry import NullMetrics
        return NullMetrics()


def get_or_create_kv_connector(app_name: str, config: KVConnectorConfig = KVConnectorConfig()):
    """The application's actor handle, creating it on first use (idempotent across processes)."""
    import ray

    remote_cls = ray.remote(KVConnectorActor)
    return remote_cls.options(name=ACTOR_NAME, namespace=actor_namespace(app_name), get_if_exists=True,
                              lifetime="detached", num_cpus=0, max_restarts=0).remote(config)


def get_kv_connector(app_name: str):
    """The existing actor's handle; raises ``ValueError`` if there is none."""
    import ray

    return ray.get_actor(ACTOR_NAME, namespace=actor_namespace(app_name))


def kill_kv_connector(app_name: str) -> None:
    import ray

    try:
        ray.kill(get_kv_connector(app_name))
    except ValueError:
        pass
