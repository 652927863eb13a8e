"""One router replica's view of the engine replicas, fed by its polls and Serve's pushes.

Which pool each known replica is in, its index capacity, this router's cursor into its KV event
log, its Ray actor id, and which replicas were dropped lately (answers of polls sent before their
removal are ignored). ``apply_snapshot`` turns one replica's poll answer into ``RouterLogic``
calls (membership, stats, KV events or a full block snapshot); ``remove`` drops a replica from the
logic and from here. No RPCs: ``deployments.router.deployment`` does the polling.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from deployments.config.app import ModelConfig, PoolConfig, Role
from deployments.messages.kv_events import KVCursor
from deployments.messages.replica_snapshot import ReplicaSnapshot
from deployments.router.logic.router_logic import ReplicaInfo, RouterLogic


def logic_role(pool: PoolConfig, model: ModelConfig) -> Role | None:
    """The role the logic gives a pool's replicas; None = not routed by the logic.

    Prefill pools take part only when their model is disaggregated (``ModelConfig.pd_threshold_tokens``:
    every prefill and decode pool of the model shares one KV path; TPU engines hand KV only to TPU
    engines that load the same connector); otherwise the model's requests run whole on the decode
    pool."""
    if pool.role == "prefill" and model.pd_threshold_tokens is None:
        return None
    return pool.role


class EngineView:
    def __init__(self, logic: RouterLogic, models: Sequence[ModelConfig]):
        self._logic = logic
        self._pool_by_name = {p.name: p for m in models for p in m.pools}
        self.roles = {p.name: logic_role(p, m) for m in models for p in m.pools}
        # model -> block size of its prefix hashes (what the ingress hashes prompts at)
        self._block_sizes = {m.name: m.routing_block_size for m in models}
        self.replica_pool: dict[str, str] = {}  # replica id -> pool name (known to the logic)
        # replica id -> this router's cursor into its KV event log (precise replicas only)
        self.cursors: dict[str, KVCursor] = {}
        self._actor_replica: dict[str, str] = {}  # Ray actor id -> replica id
        # replica id -> when it was dropped (reported dead, left Serve's running set)
        self._dropped_at_s: dict[str, float] = {}

    def replicas_of(self, pool_name: str) -> set[str]:
        return {r for r, p in self.replica_pool.items() if p == pool_name}

    def replica_of_actor(self, actor_id: str | None) -> str | None:
        return self._actor_replica.get(actor_id) if actor_id else None

    def is_routed(self, pool_name: str) -> bool:
        return self.roles.get(pool_name) is not None

    # -- changes ------------------------------------------------------------------------------

    def apply_poll(self, answers: Sequence[object], started_s: float) -> set[str]:
        """Apply the ``ReplicaSnapshot``s of one poll sent at ``started_s``; returns the replicas
        that answered. Answers of replicas dropped after that poll was sent are ignored."""
        seen = set()
        for snap in answers:
            if isinstance(snap, ReplicaSnapshot) and self._dropped_at_s.get(snap.replica_id, -1.0) < started_s:
                self.apply_snapshot(snap)
                seen.add(snap.replica_id)
        return seen

    def end_poll_round(self, started_s: float) -> None:
        """Every pool was polled since ``started_s``: older drop marks are no longer needed."""
        self._dropped_at_s = {r: t for r, t in self._dropped_at_s.items() if t >= started_s}

    def apply_snapshot(self, snap: ReplicaSnapshot) -> None:
        """One replica's poll answer: membership, stats and KV state."""
        pool = self._pool_by_name.get(snap.pool)
        role = self.roles.get(snap.pool)
        if pool is None or role is None:
            return
        rid = snap.replica_id
        model_bs = self._block_sizes[pool.model]
        is_precise = snap.publishes_kv_events and snap.block_size == model_bs
        engine_bs = snap.block_size or model_bs
        num_blocks = max(1, snap.stats.num_kv_blocks_total * engine_bs // model_bs)
        if rid not in self.replica_pool or self._logic.index.capacity(rid) != num_blocks:
            # new, or its KV capacity became known / changed
            info = ReplicaInfo(rid, pool.name, pool.model, num_blocks, role, is_precise, pool.tasks, pool.max_loras)
            self._logic.add_replica(info)
            self.replica_pool[rid] = pool.name
        if snap.actor_id:
            self._actor_replica[snap.actor_id] = rid
        # Requests other routers (and ingress fallbacks) have on the replica count as load: the
        # replica's own in-flight count minus what this router has dispatched there.
        self._logic.apply_stats(rid, snap.stats, snap.num_inflight)
        if is_precise and snap.kv_cursor is not None:
            self._apply_kv_state(rid, snap, snap.kv_cursor)

    def _apply_kv_state(self, rid: str, snap: ReplicaSnapshot, new: KVCursor) -> None:
        """Follow the replica's KV event log from this router's cursor to ``new`` (the answer's).
        An answer to an older cursor (two polls in flight at once) is ignored; the next poll reads
        from the cursor."""
        cursor = self.cursors.get(rid)
        if cursor is not None and cursor.log_id != new.log_id:
            cursor = None  # another log (a restarted replica): only its snapshot applies
        if snap.kv_blocks is not None:
            if cursor is not None and cursor.seq >= new.seq:
                return  # this router is already past that snapshot
            self._logic.apply_snapshot(rid, snap.kv_blocks, snap.kv_block_tiers)
            self.cursors[rid] = new
        elif cursor is not None and cursor.seq == snap.kv_from_seq:
            if snap.kv_events:
                self._logic.apply_kv_events(rid, snap.kv_events)
            self.cursors[rid] = new

    def remove(self, replica_id: str) -> None:
        """The replica is gone: no more routing there; its index, sessions and load drop now."""
        self._logic.remove_replica(replica_id)
        self.replica_pool.pop(replica_id, None)
        self.cursors.pop(replica_id, None)
        for actor_id in [a for a, r in self._actor_replica.items() if r == replica_id]:
            del self._actor_replica[actor_id]

    def drop(self, replica_id: str) -> None:
        """``remove``, and ignore answers of polls sent before now (reported dead, left Serve)."""
        self._dropped_at_s[replica_id] = time.monotonic()
        self.remove(replica_id)

    def num_replicas_by_pool(self) -> Mapping[str, int]:
        counts: dict[str, int] = {}
        for pool in self.replica_pool.values():
            counts[pool] = counts.get(pool, 0) + 1
        return counts
