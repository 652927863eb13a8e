"""Reaching another node's shared-memory KV store: Ray tasks pinned to that node.

Only the cross-node case pays for these (a consumer whose own node's store lacks the transfer,
after the KV-connector actor ``locate``d it elsewhere): the pinned task maps the file there and
returns the payload through Ray's object store, which moves it between nodes. Tasks ask for no
CPU, so they run on nodes whose CPUs are all taken by replicas.
"""

from __future__ import annotations

import functools
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from accel.kv_transfer.payload import KVDescriptor, KVPayload
from accel.kv_transfer.shm_store import ShmKVStore

logger = logging.getLogger(__name__)


def _read(store_path: str, transfer_id: str) -> tuple[KVDescriptor, object] | None:
    store = ShmKVStore.open(Path(store_path))
    payload = store.fetch(transfer_id) if store is not None else None
    return None if payload is None else (payload.descriptor, payload.to_wire())  # copied into the object store


def _complete(store_path: str, transfer_id: str) -> bool:
    store = ShmKVStore.open(Path(store_path))
    return store is not None and store.complete(transfer_id)


def _destroy(store_path: str) -> None:
    shutil.rmtree(store_path, ignore_errors=True)


@functools.cache
def _remote(fn: Callable[..., Any]) -> Any:
    """``fn`` as a Ray task that needs no CPU (made once per function)."""
    return ray.remote(num_cpus=0, max_retries=0)(fn)


def _on(node_id: str, fn: Callable[..., Any]) -> Any:
    """``fn``'s task pinned to ``node_id``."""
    return _remote(fn).options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))


def read_on_node(node_id: str, store_path: str, transfer_id: str, timeout_s: float) -> KVPayload | None:
    """The payload from ``node_id``'s store (None if it no longer holds it)."""
    out = ray.get(_on(node_id, _read).remote(store_path, transfer_id), timeout=timeout_s)
    return None if out is None else KVPayload.from_wire(*out)


def complete_on_node(node_id: str, store_path: str, transfer_id: str) -> None:
    """Fire and forget: the lease frees the payload if this never runs."""
    _on(node_id, _complete).remote(store_path, transfer_id)


def destroy_on_nodes(node_ids: list[str], store_path: str, timeout_s: float = 10.0) -> None:
    """Remove the store from each node (best effort: a dead node's tmpfs is gone anyway)."""
    if not node_ids:
        return
    refs = [_on(node, _destroy).remote(store_path) for node in node_ids]
    try:
        ray.get(refs, timeout=timeout_s)
    except Exception:
        logger.warning("KV store %s: removal on other nodes did not finish", store_path, exc_info=True)
