"""The typed answers of the KV-connector actor (``connector_actor.KVConnectorActor``) that are
more than one value: where a transfer's payload is (``locate``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accel.kv_transfer.payload import KVDescriptor


@dataclass(frozen=True)
class InObjectStore:
    """The payload is in Ray's object store, claimed for the caller (as ``claim``): one
    ``ObjectRef`` to the wire payload (a tuple, so Ray passes the reference instead of resolving it)."""

    descriptor: KVDescriptor
    payload_refs: tuple[Any, ...]  # ObjectRefs


@dataclass(frozen=True)
class InNodeStore:
    """The payload is in the shared-memory store at ``store_path`` on node ``node_id`` (read it
    there with ``shm_remote.read_on_node``)."""

    node_id: str
    store_path: str


KVLocation = InObjectStore | InNodeStore
