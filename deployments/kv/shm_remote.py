"""Reaching another node's shared-memory KV store: a reader actor pinned to that node.

Only the cross-node case pays for these (a consumer whose own node's store lacks the transfer,
after the KV-connector actor ``locate``d it elsewhere): the node's reader maps the file there and
returns the payload through Ray's object store, which moves it between nodes.

Why an actor per (node, store), not a task per read: a task needs a worker process on that node,
and on a node whose CPUs are all taken by replicas (or a TT host with ``num_cpus: 0``) Ray keeps
no idle worker, so every read would start a Python process that imports torch (seconds; past a
decode replica's fetch deadline, so every cross-node hand-off was recomputed). The reader is
started by the producer's replica when it starts (``start_local_reader``, only in a multi-node
cluster), so it is warm before the first hand-off; owned by that replica, it goes with it. A
consumer that finds none (a producer that never started one) starts it on first use. Readers
ask for no CPU, so they run on nodes whose CPUs are all taken by replicas.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import threading
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from accel.kv_transfer.payload import KVDescriptor, KVPayload
from accel.kv_transfer.shm_store import ShmKVStore

logger = logging.getLogger(__name__)

READER_NAMESPACE = "meshserve-kv-shm"
READER_START_TIMEOUT_S = 120.0  # a new worker process on a loaded host


class NodeStoreReader:
    """Ray actor on the node that holds ``store_path`` (one per node and store)."""

    def __init__(self, store_path: str):
        self._path = Path(store_path)
        self._store: ShmKVStore | None = None

    def ready(self) -> bool:
        return True

    def read(self, transfer_id: str) -> tuple[KVDescriptor, object] | None:
        store = self._open()
        payload = store.fetch(transfer_id) if store is not None else None
        return None if payload is None else (payload.descriptor, payload.to_wire())  # copied into the object store

    def complete(self, transfer_id: str) -> bool:
        store = self._open()
        return store is not None and store.complete(transfer_id)

    def _open(self) -> ShmKVStore | None:
        if self._store is None or not self._path.is_dir():  # (removed with its application)
            self._store = ShmKVStore.open(self._path)
        return self._store


def reader_name(node_id: str, store_path: str) -> str:
    return f"reader-{node_id}-{hashlib.sha256(store_path.encode()).hexdigest()[:12]}"


_handles: dict[tuple[str, str], Any] = {}
_handles_lock = threading.Lock()


def _reader(node_id: str, store_path: str) -> Any:
    """The reader of ``store_path`` on ``node_id``, started there if there is none (idempotent
    across processes)."""
    key = (node_id, store_path)
    with _handles_lock:
        handle = _handles.get(key)
    if handle is None:
        handle = (
            ray.remote(NodeStoreReader)
            .options(
                name=reader_name(node_id, store_path),
                namespace=READER_NAMESPACE,
                get_if_exists=True,
                num_cpus=0,
                max_restarts=0,
                max_concurrency=4,  # reads of several decode replicas at once
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            )
            .remote(store_path)
        )
        with _handles_lock:
            _handles[key] = handle
    return handle


def _forget(node_id: str, store_path: str) -> None:
    with _handles_lock:
        _handles.pop((node_id, store_path), None)


def start_local_reader(store_path: str, timeout_s: float = READER_START_TIMEOUT_S) -> None:
    """Start (and wait for) this node's reader of ``store_path``, so consumers on other nodes
    find a warm process at their first hand-off."""
    node_id = ray.get_runtime_context().get_node_id()
    ray.get(_reader(node_id, store_path).ready.remote(), timeout=timeout_s)


def read_on_node(node_id: str, store_path: str, transfer_id: str, timeout_s: float) -> KVPayload | None:
    """The payload from ``node_id``'s store (None if it no longer holds it)."""
    for attempt in (0, 1):  # a cached handle of a reader that died with its owner fails once
        try:
            out = ray.get(_reader(node_id, store_path).read.remote(transfer_id), timeout=timeout_s)
            return None if out is None else KVPayload.from_wire(*out)
        except ray.exceptions.RayActorError:
            _forget(node_id, store_path)
            if attempt == 1:
                raise
    raise AssertionError("unreachable")


def complete_on_node(node_id: str, store_path: str, transfer_id: str) -> None:
    """Fire and forget: the lease frees the payload if this never runs."""
    _reader(node_id, store_path).complete.remote(transfer_id)


def _destroy(store_path: str) -> None:
    shutil.rmtree(store_path, ignore_errors=True)


def destroy_on_nodes(node_ids: list[str], store_path: str, timeout_s: float = 10.0) -> None:
    """Remove the store from each node (best effort: a dead node's tmpfs is gone anyway). Tasks,
    not the readers: the readers went with their replicas when the application was deleted."""
    if not node_ids:
        return
    destroy = ray.remote(num_cpus=0, max_retries=0)(_destroy)
    refs = [
        destroy.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(store_path)
        for node in node_ids
    ]
    try:
        ray.get(refs, timeout=timeout_s)
    except Exception:
        logger.warning("KV store %s: removal on other nodes did not finish", store_path, exc_info=True)
