"""``KVConnectorClient``: typed calls to the application's KV-connector actor
(``connector_actor.KVConnectorActor``) over its Ray actor handle.

Three kinds of call, by who waits: blocking ones with a deadline (an engine's transfer thread:
``RayKVTransport``), ``async`` ones awaited on a replica's event loop (``NativeKVHandoff``'s
params store), and notifications nobody waits for (``complete``, ``cancel``,
``report_recompute``, ``note_shm_transfers``). Errors are the actor's own
(``accel.kv_transfer.transport`` exceptions, re-raised by Ray as subclasses) or Ray's (actor
died, timeout); the callers decide what a failure means.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import ray

from accel.block_hash import BlockHash
from accel.kv_transfer.payload import KVDescriptor
from accel.kv_transfer.shm_store import ShmStoreConfig
from deployments.kv.messages import InNodeStore, KVLocation

RPC_GRACE_S = 5.0  # on top of a call's own deadline, for the round trip


class KVConnectorClient:
    def __init__(self, handle: Any):
        """``handle``: the actor's handle (``connector_actor.get_kv_connector``)."""
        self.handle = handle

    # -- blocking, with a deadline ---------------------------------------------------------

    def store(self, transfer_id: str, descriptor: KVDescriptor, payload_ref: Any, timeout_s: float) -> float:
        """Reserve + commit a payload already in the object store; the lease's expiry."""
        expires: float = ray.get(
            self.handle.store.remote(transfer_id, descriptor, [payload_ref], timeout_s), timeout=timeout_s + RPC_GRACE_S
        )
        return expires

    def locate(self, transfer_id: str, timeout_s: float) -> KVLocation:
        """Where ``transfer_id``'s payload is; ``KVTransferNotFound`` if nowhere."""
        location: KVLocation = ray.get(self.handle.locate.remote(transfer_id), timeout=timeout_s)
        return location

    def contains(self, transfer_id: str, searched: InNodeStore | None, timeout_s: float) -> bool:
        """Committed and unexpired somewhere other than ``searched`` (a store the caller looked in)."""
        return bool(ray.get(self.handle.contains.remote(transfer_id, searched), timeout=timeout_s))

    def offer_prefix(
        self, key: str, block_size: int, hashes: list[BlockHash], block_refs: list[Any], num_bytes_per_block: int
    ) -> int:
        """Blocks for the host prefix tier; how many it took."""
        remote = self.handle.offer_prefix.remote(key, block_size, hashes, block_refs, num_bytes_per_block)
        return int(ray.get(remote, timeout=RPC_GRACE_S))

    def match_prefix(self, key: str, block_size: int, hashes: list[BlockHash], timeout_s: float) -> list[Any]:
        """``ObjectRef``s of the longest leading run of ``hashes`` the prefix tier holds."""
        refs: list[Any] = ray.get(self.handle.match_prefix.remote(key, block_size, hashes), timeout=timeout_s)
        return refs

    def shm_config(self, timeout_s: float = RPC_GRACE_S) -> ShmStoreConfig | None:
        """What a node's shared-memory store is created with (None: that path is disabled)."""
        config: ShmStoreConfig | None = ray.get(self.handle.shm_config.remote(), timeout=timeout_s)
        return config

    def stats(self, timeout_s: float = RPC_GRACE_S) -> dict[str, Any]:
        """The registry's, shared-memory store's and prefix tier's counters (tests, debugging)."""
        stats: dict[str, Any] = ray.get(self.handle.stats.remote(), timeout=timeout_s)
        return stats

    def destroy_shm(self, timeout_s: float) -> list[str]:
        """Remove the actor's node store; the other nodes whose stores the caller removes."""
        nodes: list[str] = ray.get(self.handle.destroy_shm.remote(), timeout=timeout_s)
        return nodes

    # -- awaited on an event loop ----------------------------------------------------------

    async def put_params(self, transfer_id: str, params: Mapping[str, Any], timeout_s: float) -> float:
        """Hold an engine-native connector's ``kv_transfer_params`` (leased); the lease's expiry."""
        expires: float = await asyncio.wait_for(self.handle.put_params.remote(transfer_id, dict(params)), timeout_s)
        return expires

    async def claim_params(self, transfer_id: str, timeout_s: float) -> dict[str, Any]:
        """The params, removed; ``KVTransferNotFound`` if unknown, claimed or expired."""
        params: dict[str, Any] = await asyncio.wait_for(self.handle.claim_params.remote(transfer_id), timeout_s)
        return params

    # -- notifications (not awaited) -------------------------------------------------------

    def cancel(self, transfer_id: str) -> None:
        self.handle.cancel.remote(transfer_id)

    def complete(self, transfer_id: str) -> None:
        self.handle.complete.remote(transfer_id)

    def report_recompute(self, reason: str) -> None:
        self.handle.report_recompute.remote(reason)

    def note_shm_transfers(self, node_id: str, store_path: str, transfer_ids: list[str]) -> None:
        self.handle.note_shm_transfers.remote(node_id, store_path, transfer_ids)
