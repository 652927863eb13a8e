"""What an engine replica reports about itself to every router replica that polls it."""

from __future__ import annotations

from dataclasses import dataclass

from accel.contract import EngineStats
from deployments.messages.kv_events import KVCursor, KVEvent, Tier


@dataclass(frozen=True)
class ReplicaSnapshot:
    """An engine replica's self-report (``routing_snapshot``), polled by every router replica.

    KV state for the router's prefix index, in ``accel.block_hash`` keys at ``block_size``:
    ``kv_blocks`` is the replica's full cached-block list (the router had no usable cursor into
    this replica's event log), otherwise ``kv_events`` are the events after the router's cursor
    (seq ``kv_from_seq``). ``kv_cursor`` is the router's cursor once it has applied either.
    ``publishes_kv_events`` False = neither is available (the router learns that replica from
    routing)."""

    replica_id: str
    pool: str
    stats: EngineStats
    num_inflight: int  # requests inside the replica's generate() right now
    block_size: int = 0  # engine KV block size in tokens (0 = unknown)
    publishes_kv_events: bool = False
    kv_events: tuple[KVEvent, ...] = ()
    kv_blocks: tuple[int, ...] | None = None
    # the blocks of ``kv_blocks`` held only on a slower tier, with it (the rest are on the device)
    kv_block_tiers: tuple[tuple[int, Tier], ...] = ()
    kv_cursor: KVCursor | None = None
    kv_from_seq: int = 0
    actor_id: str | None = None  # the replica's Ray actor id (matches RayActorError.actor_id)
