"""``KVTransport`` over the KV-connector actor, for engines (blocking calls, deadlines).

Usable from any process of the cluster: a Serve replica (Ray already initialized) or a vLLM child
process (``connect`` joins the running cluster with ``ray.init(address="auto")``).

Data path per payload (see ``deployments.kv.connector_actor``): up to the store's
``max_payload_bytes``, this node's shared-memory store — ``put``, ``fetch`` and ``complete`` are
file operations, no RPC (in a multi-node cluster the actor learns of the transfer from a batched
background notification, for consumers on other nodes; the actor's ``locate`` waits briefly for
one still in flight). Larger payloads, or a node without a usable store:
the object store plus actor RPCs. A consumer looks in its node's store first, then asks the actor
where the transfer is. The shared-memory path keeps working while the actor is dead; the
object-store path then raises ``KVTransferError`` and the next call looks the actor up again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path

import ray
import torch

from accel.kv_transfer.payload import KVPayload, tensor_from_wire, tensor_to_wire
from accel.kv_transfer.shm_store import ShmKVStore
from accel.kv_transfer.transport import KVTransferError, KVTransferNotFound
from deployments.kv.connector_actor import actor_namespace, get_kv_connector, shm_store_path
from deployments.kv.connector_client import KVConnectorClient
from deployments.kv.messages import InNodeStore, InObjectStore
from deployments.kv.shm_remote import complete_on_node, read_on_node, start_local_reader

logger = logging.getLogger(__name__)

STORE_RETRY_S = 10.0  # a node without a usable store asks again after this long
NOTE_BATCH_S = 0.005  # how long transfer notes gather before one RPC carries them
NODE_CHECK_S = 10.0  # how often the notes thread asks whether the cluster has several nodes


def connect_to_cluster(app_name: str, address: str | None = None) -> None:
    """Join the running Ray cluster from a process Ray did not start (idempotent). Pass the GCS
    address the replica saw (``ray.get_runtime_context().gcs_address``): "auto" picks whatever
    cluster this machine started last, which is wrong when several run side by side."""
    if not ray.is_initialized():
        ray.init(
            address=address or "auto", namespace=actor_namespace(app_name), log_to_driver=False, configure_logging=False
        )


class RayKVTransport:
    """``address``: the cluster's GCS address, for processes Ray did not start (vLLM children);
    None inside a Ray worker or driver that already called ``ray.init``. ``shm_root``: where
    this node's stores live (default ``ENVS.kv_shm_root``). ``note_transfers``: tell the actor
    where shared-memory transfers are (None: only while the cluster has several nodes, the only
    case a consumer can need it)."""

    def __init__(
        self, app_name: str, address: str | None = None, shm_root: str | None = None, note_transfers: bool | None = None
    ):
        self.app_name = app_name
        self.address = address
        self.shm_root = Path(shm_root) if shm_root else None
        self._connector: KVConnectorClient | None = None
        self._store: ShmKVStore | None = None
        self._store_checked_s = -float("inf")
        self._node_id: str | None = None
        self._lock = threading.Lock()
        self._remote_reads: dict[str, InNodeStore] = {}  # transfer id -> the other node's store it came from
        self._notes: queue.SimpleQueue[str] | None = None
        self._note_transfers = note_transfers
        self._is_multi_node = True  # until the notes thread has asked the cluster

    def put(self, transfer_id: str, payload: KVPayload, timeout_s: float) -> None:
        store = self._shm()
        if store is not None and payload.descriptor.num_bytes <= store.max_payload_bytes:
            try:
                store.put(transfer_id, payload, timeout_s)
            except OSError as e:  # the store vanished (application deleted) or tmpfs trouble
                self._store_checked_s = -float("inf")
                raise KVTransferError(f"KV store failed to take {transfer_id!r}: {e}") from e
            self._note(transfer_id, store)
            return
        self._put_object(transfer_id, payload, timeout_s)

    def _put_object(self, transfer_id: str, payload: KVPayload, timeout_s: float) -> None:
        """One copy into the object store, then one RPC that waits for capacity and commits.
        We own the object; once the actor holds its borrowed reference we drop ours, so the
        actor's reference alone keeps the payload alive (freed on completion or expiry)."""
        self._actor()  # joins the cluster first: a bare ray.put would auto-start a private one
        ref = ray.put(payload.to_wire())
        for attempt in (0, 1):  # a handle cached before the actor was recreated fails once
            connector = self._actor()
            try:
                connector.store(transfer_id, payload.descriptor, ref, timeout_s)
                return
            except KVTransferError:
                raise
            except Exception as e:
                self._connector = None
                if attempt == 1 or not isinstance(e, ray.exceptions.RayActorError):
                    try:
                        connector.cancel(transfer_id)
                    except Exception:
                        pass
                    raise KVTransferError(f"KV connector failed to store {transfer_id!r}: {e}") from e

    def fetch(self, transfer_id: str, timeout_s: float) -> KVPayload:
        store = self._shm()
        if store is not None:
            payload = store.fetch(transfer_id)
            if payload is not None:
                return payload
        try:
            where = self._actor().locate(transfer_id, timeout_s)
            if isinstance(where, InObjectStore):
                return KVPayload.from_wire(where.descriptor, ray.get(where.payload_refs[0], timeout=timeout_s))
            payload = self._fetch_other_store(transfer_id, where, store, timeout_s)
        except KVTransferError:
            raise
        except Exception as e:
            self._connector = None
            raise KVTransferError(f"KV transfer {transfer_id!r} unreadable: {e}") from e
        with self._lock:
            self._remote_reads[transfer_id] = where
        return payload

    def _fetch_other_store(
        self, transfer_id: str, where: InNodeStore, store: ShmKVStore | None, timeout_s: float
    ) -> KVPayload:
        if store is not None and where.store_path == str(store.path) and where.node_id == self._node_id:
            raise KVTransferNotFound(f"no KV transfer {transfer_id!r} (completed or lease expired)")
        payload = read_on_node(where.node_id, where.store_path, transfer_id, timeout_s)
        if payload is None:
            raise KVTransferNotFound(
                f"no KV transfer {transfer_id!r} on node {where.node_id} (completed or lease expired)"
            )
        return payload

    def contains(self, transfer_id: str, timeout_s: float) -> bool:
        """Whether ``transfer_id`` is committed and unexpired (False if unknown or unreachable).
        Another node's transfer counts as held on the actor's word (its lease is checked there
        when read)."""
        store = self._shm()
        if store is not None and store.contains(transfer_id):
            return True
        try:
            searched = InNodeStore(self._node_id, str(store.path)) if store is not None and self._node_id else None
            return self._actor().contains(transfer_id, searched, timeout_s)
        except Exception:
            self._connector = None
            logger.warning("KV connector unreachable while looking up %s", transfer_id, exc_info=True)
            return False

    # -- host-memory prefix tier (deployments/kv/prefix_tier.py) --------------------------------

    def offer_prefix(self, key: str, block_size: int, hashes: list[int], blocks: list[torch.Tensor]) -> int:
        """Offer full blocks (each ``[L, 2, block_size, Hkv, D]``) under their chained hashes;
        ``key`` = model fingerprint and dtype. Returns how many the tier took; 0 if unreachable."""
        try:
            connector = self._actor()
            refs = [ray.put(tensor_to_wire(b)) for b in blocks]
            nbytes = blocks[0].numel() * blocks[0].element_size() if blocks else 0
            return connector.offer_prefix(key, block_size, hashes, refs, nbytes)
        except Exception:
            self._connector = None
            logger.warning("prefix tier: offer failed", exc_info=True)
            return 0

    def match_prefix(
        self, key: str, block_size: int, hashes: list[int], dtype: torch.dtype, timeout_s: float
    ) -> list[torch.Tensor]:
        """Blocks of the longest leading run of ``hashes`` the tier holds (read-only tensors)."""
        try:
            refs = self._actor().match_prefix(key, block_size, hashes, timeout_s)
            return [tensor_from_wire(a, dtype) for a in ray.get(refs, timeout=timeout_s)] if refs else []
        except Exception:
            self._connector = None
            logger.warning("prefix tier: lookup failed", exc_info=True)
            return []

    def complete(self, transfer_id: str) -> None:
        with self._lock:
            remote = self._remote_reads.pop(transfer_id, None)
        try:
            if remote is not None:
                complete_on_node(remote.node_id, remote.store_path, transfer_id)
                return
            store = self._shm()
            if store is not None and store.complete(transfer_id):
                return
            self._actor().complete(transfer_id)
        except Exception:  # the lease frees it anyway
            logger.debug("complete(%s) not delivered", transfer_id, exc_info=True)

    def report_recompute(self, reason: str) -> None:
        try:
            self._actor().report_recompute(reason)
        except Exception:
            logger.warning("KV connector unreachable; recompute (%s) not counted", reason)

    def _actor(self) -> KVConnectorClient:
        if self._connector is None:
            try:
                connect_to_cluster(self.app_name, self.address)
                self._connector = get_kv_connector(self.app_name)
            except Exception as e:
                raise KVTransferError(f"no KV connector for application {self.app_name!r}: {e}") from e
        return self._connector

    # -- this node's shared-memory store ----------------------------------------------------

    def serve_other_nodes(self) -> None:
        """At replica start, in a multi-node cluster: open (or create) this node's store and start
        its reader for consumers on other nodes (``shm_remote``), so the first cross-node
        hand-off finds a warm process. Best effort: a consumer starts a missing reader itself."""
        try:
            connect_to_cluster(self.app_name, self.address)
            if not _is_multi_node():
                return
            store = self._shm()
            if store is not None:
                start_local_reader(str(store.path))
        except Exception:
            logger.warning("KV store of %r: no reader for other nodes started", self.app_name, exc_info=True)

    def _shm(self) -> ShmKVStore | None:
        """This node's store: opened once; created from the actor's config if this node has none
        yet (the actor creates its own node's); None when disabled or unusable (retried later)."""
        if self._store is not None or time.monotonic() - self._store_checked_s < STORE_RETRY_S:
            return self._store
        with self._lock:
            if self._store is None and time.monotonic() - self._store_checked_s >= STORE_RETRY_S:
                self._store_checked_s = time.monotonic()
                self._store = self._open_store()
        return self._store

    def _open_store(self) -> ShmKVStore | None:
        try:
            connect_to_cluster(self.app_name, self.address)
            self._node_id = ray.get_runtime_context().get_node_id()
            path = shm_store_path(self.app_name, self.shm_root)
            store = ShmKVStore.open(path)
            if store is None:
                config = self._actor().shm_config()
                store = ShmKVStore.create(path, config) if config is not None else None
            return store
        except Exception:
            logger.warning(
                "no shared-memory KV store for %r on this node; using the object store", self.app_name, exc_info=True
            )
            return None

    def _note(self, transfer_id: str, store: ShmKVStore) -> None:
        """Tell the actor, off the caller's path, that this node's ``store`` holds ``transfer_id``."""
        notes = self._notes
        if notes is None:
            with self._lock:
                if self._notes is None and self._node_id is not None:
                    self._notes = queue.SimpleQueue()
                    args = (self._notes, self._node_id, str(store.path))
                    threading.Thread(target=self._send_notes, args=args, name="kv-shm-notes", daemon=True).start()
                notes = self._notes
        if notes is not None and (self._note_transfers or (self._note_transfers is None and self._is_multi_node)):
            notes.put(transfer_id)

    def _send_notes(self, notes: queue.SimpleQueue[str], node_id: str, store_path: str) -> None:
        next_check_s = 0.0
        while True:
            if self._note_transfers is None and time.monotonic() >= next_check_s:
                try:
                    self._is_multi_node = _is_multi_node()
                except Exception:
                    self._is_multi_node = True
                next_check_s = time.monotonic() + NODE_CHECK_S
            try:
                batch = [notes.get(timeout=NODE_CHECK_S)]
            except queue.Empty:
                continue
            time.sleep(NOTE_BATCH_S)  # one RPC per batch, not per transfer: keeps it off the CPU
            while not notes.empty():
                batch.append(notes.get())
            try:
                self._actor().note_shm_transfers(node_id, store_path, batch)
            except Exception:  # only cross-node consumers miss it (they recompute)
                self._connector = None
                logger.debug("KV connector not told of %d transfer(s)", len(batch), exc_info=True)


def _is_multi_node() -> bool:
    """Whether the cluster has more than one live node now."""
    nodes = ray.nodes()  # type: ignore[no-untyped-call]  # ray.nodes has no annotations upstream
    return len([n for n in nodes if n.get("Alive")]) > 1
