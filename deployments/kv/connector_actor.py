"""The KV-connector actor: one per application, where prefill replicas leave a prompt's KV and
decode replicas pick it up.

Two data paths, chosen by the producer's ``RayKVTransport`` and invisible to engines:

- Same node, payloads up to ``shm_max_payload_bytes`` (the common PD hand-off): the node's
  shared-memory store (``accel.kv_transfer.shm_store``, a tmpfs directory per application and
  cluster). Producer and consumer talk through files and a ``flock``-guarded byte ledger; no RPC
  and no object-store put per hand-off. This actor creates the store on its node (clients on
  other nodes create theirs with ``shm_config``), sweeps its leases every second (the state lives
  in the directory, so a restarted actor picks it up), turns the ledger's counters into metrics,
  and removes the directory with the application (``kill_kv_connector``). While the cluster has
  several nodes, producers notify it in the background (``note_shm_transfers``), so a consumer
  on another node can ``locate`` a payload and pull it through a task pinned to the producer's node (``shm_remote``).
- Larger payloads, or no usable store: the producer ``ray.put``s the canonical payload (one copy
  into the node's shared object store) and hands the actor the ``ObjectRef``; the producer then
  drops its own reference, so the actor's borrowed reference alone keeps the payload alive and
  dropping it (completion or lease expiry) frees it. Consumers read it zero-copy. Ray >= 2.56
  removed ``ray.put(_owner=...)``, so the producer process stays the object's owner: if it dies
  before the decode side reads, the read fails and the decode side recomputes the prompt (the
  same fallback as an expired lease or a dead actor). Logic lives in the Ray-free ``KVRegistry``
  / ``KVPrefixTier``; this module adds naming and a lease sweeper (metrics: ``kv_connector_metrics``).

``capacity_bytes`` bounds each path separately: the object-store registry cluster-wide, and each
node's shared-memory store (its spare, reusable files included).

Addressing: a named detached actor ``kv_connector`` in namespace ``meshserve-kv-<app>``, so any
process of the cluster — a Serve replica, or a vLLM engine-core/worker child that joined the
cluster with ``ray.init(address="auto")`` — finds it by name. Created idempotently by
``get_or_create_kv_connector`` and restarted by Ray if its process dies (``max_restarts=-1``:
in-flight object-store transfers are lost and recomputed, see ``get_or_create_kv_connector``);
``kill_kv_connector`` removes it with the application. Callers
talk to it through ``connector_client.KVConnectorClient`` (what both lookups return).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import shutil
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from accel.block_hash import BlockHash
from accel.envs import ENVS
from accel.kv_transfer.payload import KVDescriptor
from accel.kv_transfer.shm_store import ShmKVStore, ShmStoreConfig, store_path
from accel.kv_transfer.transport import KVTransferNotFound
from deployments.kv.connector_client import KVConnectorClient
from deployments.kv.messages import InNodeStore, InObjectStore, KVLocation
from deployments.kv.metrics import RayKVMetrics, make_metrics
from deployments.kv.prefix_tier import KVPrefixTier
from deployments.kv.registry import KVRegistry
from deployments.kv.shm_remote import destroy_on_nodes

logger = logging.getLogger(__name__)

ACTOR_NAME = "kv_connector"
SWEEP_PERIOD_S = 1.0
# A producer's note (``note_shm_transfers``) leaves its node in the background, after ``put``
# returned and the ticket went out, so a consumer on another node can ask before it arrives (the
# ticket's path through Serve is a few RPCs; the note one RPC after a batching pause). ``locate``
# and ``contains`` wait this long for it before answering "not found" (below the callers'
# deadlines: ``fetch_timeout_s`` 5 s, vLLM's ``lookup_timeout_s`` 2 s).
NOTE_GRACE_S = 1.0
NOTE_POLL_S = 0.01


@dataclass(frozen=True)
class KVConnectorConfig:
    capacity_bytes: int = 1 << 30
    lease_s: float = 30.0
    prefix_tier_bytes: int = 0  # 0 = no prefix tier
    # Payloads up to this size go through the node's shared-memory store; 0 = always the object
    # store. The object store's (multi-threaded) copy wins from ~128 MiB (bench/kv_transfer.py).
    shm_max_payload_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if (
            self.capacity_bytes <= 0
            or self.lease_s <= 0
            or self.prefix_tier_bytes < 0
            or self.shm_max_payload_bytes < 0
        ):
            raise ValueError(f"invalid KV connector config {self}")

    @property
    def shm_config(self) -> ShmStoreConfig:
        return ShmStoreConfig(self.capacity_bytes, self.lease_s, self.shm_max_payload_bytes)


def actor_namespace(app_name: str) -> str:
    return f"meshserve-kv-{app_name}"


def shm_store_path(app_name: str, root: Path | None = None) -> Path:
    """This node's shared-memory store of ``app_name`` in the cluster this process is connected
    to (the GCS address tells clusters on one machine apart)."""
    import ray

    tag = hashlib.sha256(ray.get_runtime_context().gcs_address.encode()).hexdigest()[:10]
    return store_path(root or ENVS.kv_shm_root, app_name, tag)


class KVConnectorActor:
    """Async Ray actor. Payload arguments are ``[ObjectRef]`` (a list, so Ray passes the reference
    instead of resolving it); errors are ``accel.kv_transfer.transport`` exceptions."""

    def __init__(self, config: KVConnectorConfig, app_name: str = "default"):
        self._config = config
        metrics = make_metrics()
        self._registry = KVRegistry(config.capacity_bytes, config.lease_s, metrics=metrics)
        self._tier = KVPrefixTier(config.prefix_tier_bytes) if config.prefix_tier_bytes else None
        self._sweeper: asyncio.Task[None] | None = None
        self._shm = _ShmSide(config, app_name, metrics) if config.shm_max_payload_bytes else None

    async def store(
        self, transfer_id: str, descriptor: KVDescriptor, payload_refs: list[Any], timeout_s: float
    ) -> float:
        """Reserve + commit in one round trip (the payload is already in the object store; if it
        does not fit in time the put fails and the producer's reference frees it)."""
        self._ensure_sweeper()
        await self._registry.reserve(transfer_id, descriptor.num_bytes, timeout_s)
        return self._registry.commit(transfer_id, descriptor, payload_refs[0])

    async def cancel(self, transfer_id: str) -> None:
        self._registry.cancel(transfer_id)

    async def claim(self, transfer_id: str) -> tuple[KVDescriptor, list[Any]]:
        descriptor, ref = self._registry.claim(transfer_id)
        return descriptor, [ref]

    async def complete(self, transfer_id: str) -> None:
        self._registry.complete(transfer_id)

    async def contains(self, transfer_id: str, searched: InNodeStore | None = None) -> bool:
        """Committed and unexpired, in the object store or some node's shared-memory store other
        than ``searched`` (the store the caller already looked in)."""
        if self._registry.contains(transfer_id):
            return True
        return await self._noted(transfer_id, searched) is not None

    async def put_params(self, transfer_id: str, params: dict[str, Any]) -> float:
        """An engine-native connector's ``kv_transfer_params`` (TPU PD: this actor is only the
        control plane pairing prefill and decode); see ``KVRegistry.put_params``."""
        self._ensure_sweeper()
        return self._registry.put_params(transfer_id, params)

    async def claim_params(self, transfer_id: str) -> dict[str, Any]:
        return self._registry.claim_params(transfer_id)

    async def report_recompute(self, reason: str) -> None:
        self._registry.report_recompute(reason)

    async def offer_prefix(
        self,
        fingerprint: str,
        block_size: int,
        hashes: list[BlockHash],
        block_refs: list[Any],
        num_bytes_per_block: int,
    ) -> int:
        if self._tier is None:
            return 0
        return self._tier.offer(fingerprint, block_size, hashes, block_refs, num_bytes_per_block)

    async def match_prefix(self, fingerprint: str, block_size: int, hashes: list[BlockHash]) -> list[Any]:
        return [] if self._tier is None else self._tier.match(fingerprint, block_size, hashes)

    # -- the shared-memory path (see the module docstring) ----------------------------------

    async def shm_config(self) -> ShmStoreConfig | None:
        """What a client on another node creates its node's store with (None: path disabled)."""
        return self._config.shm_config if self._shm is not None else None

    async def note_shm_transfers(self, node_id: str, store: str, transfer_ids: list[str]) -> None:
        """Fire-and-forget from producers: these transfers were committed in ``store`` on
        ``node_id`` (only consumers on other nodes need to learn it)."""
        if self._shm is not None:
            self._shm.note(node_id, store, transfer_ids)

    async def locate(self, transfer_id: str) -> KVLocation:
        """For a consumer that did not find ``transfer_id`` in its node's store: the object-store
        payload (claimed, as ``claim``) or the node store holding it; ``KVTransferNotFound`` if
        neither."""
        try:
            descriptor, refs = await self.claim(transfer_id)
            return InObjectStore(descriptor, tuple(refs))
        except KVTransferNotFound:
            where = await self._noted(transfer_id)
            if where is None:
                raise
            return where

    async def _noted(self, transfer_id: str, searched: InNodeStore | None = None) -> InNodeStore | None:
        """The node store a producer noted ``transfer_id`` in (not ``searched``, the store the
        caller already looked in), waiting up to ``NOTE_GRACE_S`` for a note still in flight."""
        if self._shm is None:
            return None
        deadline = time.monotonic() + NOTE_GRACE_S
        while True:
            where = self._shm.where(transfer_id)
            if where is not None:
                return where if where != searched else None
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(NOTE_POLL_S)

    async def destroy_shm(self) -> list[str]:
        """Remove this node's store (the application is going away); returns the other nodes
        that reported transfers, whose stores the caller removes."""
        return self._shm.destroy() if self._shm is not None else []

    async def stats(self) -> dict[str, Any]:
        out = {"registry": asdict(self._registry.stats())}
        if self._shm is not None:
            shm = self._shm.stats()
            out["shm"] = shm
            reg = out["registry"]
            for key, value in (
                ("num_transfers", shm["num_live"]),
                ("num_bytes_used", shm["bytes_live"]),
                ("num_expired", shm["num_expired"]),
                ("num_completed", shm["num_completed"]),
                ("num_rejected", shm["num_rejected_capacity"] + shm["num_rejected_too_large"]),
            ):
                reg[key] += value
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


class _ShmSide:
    """This node's shared-memory store as the actor sees it: created at start (adopted after a
    restart), swept by a thread, counters reported since this actor started; plus where other
    nodes' producers said their transfers are."""

    def __init__(self, config: KVConnectorConfig, app_name: str, metrics: Any):
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        self.lease_s = config.lease_s
        path = shm_store_path(app_name)
        _remove_orphan_stores(path.parent)
        self.store = ShmKVStore.create(path, config.shm_config)
        (path / "owner").write_text(ray.get_runtime_context().gcs_address)
        self.baseline = self.store.snapshot()  # counters before this actor: not ours to report
        self._metrics = metrics
        self._lock = threading.Lock()
        self._remote: dict[str, tuple[str, str, float]] = {}  # transfer id -> (node, store, expires)
        self._stop = threading.Event()
        threading.Thread(target=self._sweep_loop, name="kv-shm-sweeper", daemon=True).start()

    def note(self, node_id: str, store: str, transfer_ids: list[str]) -> None:
        now = time.monotonic()
        with self._lock:
            for tid in [t for t, (_, _, expires) in self._remote.items() if expires <= now]:
                del self._remote[tid]
            for tid in transfer_ids:
                self._remote[tid] = (node_id, store, now + self.lease_s)

    def where(self, transfer_id: str) -> InNodeStore | None:
        with self._lock:
            entry = self._remote.get(transfer_id)
        if entry is None or entry[2] <= time.monotonic():
            return None
        return InNodeStore(entry[0], entry[1])

    def stats(self) -> dict[str, int]:
        s, b = asdict(self.store.snapshot()), asdict(self.baseline)
        for key in (
            "num_committed",
            "bytes_committed",
            "num_completed",
            "num_expired",
            "num_rejected_capacity",
            "num_rejected_too_large",
            "num_cancelled",
        ):
            s[key] -= b[key]
        return s

    def destroy(self) -> list[str]:
        self._stop.set()
        self.store.destroy()
        with self._lock:
            return sorted({node for node, _, _ in self._remote.values() if node != self.node_id})

    def _sweep_loop(self) -> None:
        seen = self.baseline
        while not self._stop.wait(SWEEP_PERIOD_S):
            try:
                expired = self.store.sweep()
                now = self.store.snapshot()
                if isinstance(self._metrics, RayKVMetrics):
                    self._metrics.on_shm_progress(seen, now, self.store.drain_latencies())
                seen = now
                if expired:
                    logger.info("KV connector: %d shared-memory lease(s) expired and were freed", expired)
            except FileNotFoundError:
                return  # the store was removed (application deleted)
            except Exception:
                logger.exception("KV connector: shared-memory sweep failed")


def _remove_orphan_stores(root: Path) -> None:
    """Stores whose cluster is gone (its GCS refuses connections): a cluster that stopped without
    ``kill_kv_connector`` (``ray.shutdown``, a crash) cannot remove its own tmpfs directory."""
    for owner in root.glob("meshserve-kv-*/owner"):
        try:
            host, _, port = owner.read_text().strip().rpartition(":")
            with socket.create_connection((host, int(port)), timeout=1.0):
                continue
        except ConnectionRefusedError:
            logger.info("removing the KV store of a stopped cluster: %s", owner.parent)
            shutil.rmtree(owner.parent, ignore_errors=True)
        except (OSError, ValueError):
            continue  # unreachable for another reason: leave it


def get_or_create_kv_connector(app_name: str, config: KVConnectorConfig = KVConnectorConfig()) -> KVConnectorClient:
    """The application's actor, creating it on first use (idempotent across processes)."""
    import ray

    remote_cls = ray.remote(KVConnectorActor)
    handle = remote_cls.options(
        name=ACTOR_NAME,
        namespace=actor_namespace(app_name),
        get_if_exists=True,
        lifetime="detached",
        num_cpus=0,
        # A crashed actor (its process killed, OOM) is restarted by Ray with the same arguments;
        # handles stay valid. Calls while it restarts fail at once (``ActorUnavailableError``:
        # that hand-off is recomputed, no engine waits on the restart). What it held is lost:
        # object-store transfers in flight are unreadable and their decode sides recompute; the
        # node's shared-memory store is adopted as is. Only ``kill_kv_connector`` ends it.
        max_restarts=-1,
    ).remote(config, app_name)
    client = KVConnectorClient(handle)
    client.shm_config(timeout_s=60)  # started: its node's store exists from here on
    return client


def get_kv_connector(app_name: str) -> KVConnectorClient:
    """The existing actor; raises ``ValueError`` if there is none."""
    import ray

    return KVConnectorClient(ray.get_actor(ACTOR_NAME, namespace=actor_namespace(app_name)))


def kill_kv_connector(app_name: str) -> None:
    """Remove the application's actor and its shared-memory stores (best effort on other nodes)."""
    import ray

    try:
        client: KVConnectorClient | None = get_kv_connector(app_name)
    except ValueError:
        client = None
    other_nodes: list[str] = []
    if client is not None:
        try:
            other_nodes = client.destroy_shm(timeout_s=10)
        except Exception:  # a dead actor: its node's store is removed below if it is this node
            logger.warning("KV connector of %r did not remove its store", app_name, exc_info=True)
        ray.kill(client.handle)
    path = shm_store_path(app_name)
    shutil.rmtree(path, ignore_errors=True)  # this node's, whether or not the actor lived here
    destroy_on_nodes(other_nodes, str(path))
