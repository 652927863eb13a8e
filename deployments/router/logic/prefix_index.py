"""Which replica holds which prefix blocks: the router's prefix index.

Keys are ``accel.block_hash`` chained block hashes (process-independent, the engines' own keys),
so "replica r holds block i of this prompt" implies r holds the whole prefix up to block i, and
the longest cached prefix on r is the number of leading prompt hashes r holds.

Layout (invariant: both views always agree):
- ``_owners``: block hash -> set of replica ids holding it (global; makes a lookup O(1) per block);
- ``_lru[r]``: ordered block hashes of replica r, least recently used first, at most
  ``_capacity[r]`` entries (the replica's KV capacity in blocks).

A prompt's blocks are touched last-block-first, so its *first* block is the most recent and an
eviction takes prompt tails before heads — as vLLM's free queue does (it frees a request's blocks
in reverse order). That keeps each replica's set (nearly) prefix-closed, which is what makes
"leading hashes held" a faithful longest-prefix length.

Lanes (cache domains inside a replica: a TT replica's lanes are separate prefix caches; a request
only hits the lane it runs on, and that lane's coordinator picks the best-matching lane by the
same rule as the router, ``accel.cache_affinity``): ``_lanes[r]`` maps a block hash to the bit set
of r's lanes holding it, from lane-tagged KV events. A hash with no entry there has unknown lanes
(learned from routing, or from a snapshot) and counts for every lane; a removal on any lane drops
it (the index then under-estimates, never over-estimates). ``match`` reports, per replica, the
longest prefix one single lane holds — what the replica can actually serve from cache — not the
union's. A replica that only ever reported lane 0 skips that pass.

Two modes (this base class and ``ApproximatePrefixIndex`` here, ``PrecisePrefixIndex`` in
``precise_index.py``; by name: ``index_modes.make_prefix_index``):
- ``approximate``: learns from routing decisions (the chosen replica's prompt blocks are inserted
  when the request is dispatched); engine events are ignored.
- ``precise``: follows the engine's KV events (blocks stored / removed / all cleared). Events
  arrive a poll later than the dispatch that causes them (``router.stats_period_s``), so a
  routed prompt's blocks the replica does not hold yet are recorded at dispatch as *speculative*
  entries (as llm-d's ``speculativeIndexing`` and vllm-router kv_aware's ``speculative_insert``
  do): a burst of siblings sent within one poll then finds the first one's replica. Each lives
  ``router.speculative_ttl_s`` unless a ``BlockStored`` confirms it (it becomes an ordinary entry,
  with the event's lane); a removal or clear drops it at once. The LRU bound stays as a safety
  net against lost removal events.
Both rebuild a replica from a full snapshot of its cached block hashes (router restart).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence, Set
from typing import ClassVar

from accel.block_hash import BlockHash
from deployments.messages.kv_events import KVEvent, Tier


def tier_credit(host: float, storage: float) -> dict[Tier, float]:
    """What one held block is worth per tier, in device blocks (``CostWeights``' docstring)."""
    return {"device": 1.0, "host": host, "storage": storage}


class PrefixIndex(ABC):
    """Per-replica, capacity-bounded LRU sets of block hashes with longest-prefix lookup.

    Replica ids are opaque strings. Methods taking a replica id that was never added raise
    ``KeyError``, except ``remove_replica`` (idempotent: dead replicas are reported more than once).
    """

    mode: ClassVar[str]

    def __init__(self) -> None:
        self._owners: dict[BlockHash, set[str]] = {}
        self._lru: dict[str, OrderedDict[BlockHash, None]] = {}
        self._capacity: dict[str, int] = {}
        self._lanes: dict[str, dict[BlockHash, int]] = {}  # replica -> hash -> lane bit set
        self._multi_lane: set[str] = set()  # replicas that reported a lane other than 0

    # ----- replicas -------------------------------------------------------------------------
    def add_replica(self, replica_id: str, num_kv_blocks: int) -> None:
        """Start tracking a replica whose engine holds ``num_kv_blocks`` KV blocks (its LRU bound).
        Re-adding an existing replica only updates its capacity (evicting down to it)."""
        if num_kv_blocks <= 0:
            raise ValueError(f"num_kv_blocks must be positive, got {num_kv_blocks}")
        self._capacity[replica_id] = num_kv_blocks
        lru = self._lru.setdefault(replica_id, OrderedDict())
        self._lanes.setdefault(replica_id, {})
        self._evict_to(replica_id, lru, num_kv_blocks)

    def remove_replica(self, replica_id: str) -> None:
        """Forget a replica and every block it held, at once."""
        lru = self._lru.pop(replica_id, None)
        self._capacity.pop(replica_id, None)
        self._lanes.pop(replica_id, None)
        self._multi_lane.discard(replica_id)
        if lru is None:
            return
        for block_hash in lru:
            self._disown(block_hash, replica_id)

    def replicas(self) -> tuple[str, ...]:
        return tuple(sorted(self._lru))

    def set_event_driven(self, replica_id: str, is_event_driven: bool) -> None:
        """Whether the replica's engine publishes KV events; only ``precise`` mode cares (a
        replica without events is learned from routing there, as in ``approximate``)."""
        self._lru[replica_id]  # unknown replica -> KeyError

    def num_blocks(self, replica_id: str) -> int:
        return len(self._lru[replica_id])

    def capacity(self, replica_id: str) -> int:
        return self._capacity[replica_id]

    @property
    def num_cached_blocks(self) -> int:
        """Blocks held summed over replicas (a block on two replicas counts twice)."""
        return sum(len(lru) for lru in self._lru.values())

    def holds(self, replica_id: str, block_hash: BlockHash) -> bool:
        return block_hash in self._lru[replica_id]

    # ----- lookup ---------------------------------------------------------------------------
    def match(self, block_hashes: Sequence[BlockHash], candidates: Set[str]) -> dict[str, int]:
        """Number of leading ``block_hashes`` each candidate holds, for candidates holding >= 1.

        Walks the prompt once, narrowing the set of replicas still matching; each step is one
        dict lookup plus a C-level subset test over the still-matching replicas, so the cost is
        O(prompt blocks + replicas) set work and stops at the first block nobody holds. Does not
        touch the LRU order (a lookup is not a use; dispatch is).
        """
        matched: dict[str, int] = {}
        owners_of = self._owners
        active = self._first_block_holders(block_hashes, candidates)
        num_blocks = len(block_hashes)
        i = 1
        while active and i < num_blocks:
            owners = owners_of.get(block_hashes[i])
            if owners is None:
                break
            if not active <= owners:
                still = active & owners
                for replica_id in active - still:
                    matched[replica_id] = i
                active = still
            i += 1
        for replica_id in active:
            matched[replica_id] = i
        return self._narrow_to_one_lane(block_hashes, matched)

    def credit(
        self, block_hashes: Sequence[BlockHash], matched: Mapping[str, int], tier_credit: Mapping[Tier, float]
    ) -> dict[str, float]:
        """Each matched replica's prefix in device-block equivalents: a leading block held only on
        a slower tier counts ``tier_credit[tier]`` (loading it back costs a transfer). Only the
        precise index knows tiers; here every held block is a device block."""
        return {replica_id: float(n) for replica_id, n in matched.items()}

    def _narrow_to_one_lane(self, block_hashes: Sequence[BlockHash], matched: dict[str, int]) -> dict[str, int]:
        """Cut each multi-lane replica's match to the longest prefix a single lane holds
        (O(matched blocks) per such replica; lane-0-only replicas are untouched)."""
        for replica_id in self._multi_lane.intersection(matched):
            lanes_of = self._lanes[replica_id]
            common = -1  # lanes holding every block so far (all bits: unknown lanes count for all)
            n = matched[replica_id]
            for i in range(n):
                mask = lanes_of.get(block_hashes[i])
                if mask is not None:
                    common &= mask
                    if not common:
                        n = i
                        break
            if n:
                matched[replica_id] = n
            else:
                del matched[replica_id]
        return matched

    def _first_block_holders(self, block_hashes: Sequence[BlockHash], candidates: Set[str]) -> set[str]:
        """The candidates holding the prompt's first block: where every ``match`` walk starts
        (empty for an empty prompt; the walk then matches nobody)."""
        first = self._owners.get(block_hashes[0]) if block_hashes else None
        return first & candidates if first else set()

    # ----- mode-specific updates ------------------------------------------------------------
    @abstractmethod
    def on_routed(self, replica_id: str, block_hashes: Sequence[BlockHash]) -> None:
        """A request with these prompt blocks was dispatched to ``replica_id``."""

    @abstractmethod
    def apply_events(self, replica_id: str, events: Iterable[KVEvent]) -> None:
        """The engine of ``replica_id`` reported these cache changes, in order."""

    def apply_snapshot(
        self, replica_id: str, block_hashes: Sequence[BlockHash], tiers: Sequence[tuple[BlockHash, Tier]] = ()
    ) -> None:
        """Replace the replica's contents with the engine's full list of cached blocks.

        ``block_hashes`` is ordered least recently used first (an engine that cannot tell may
        send any order; only eviction order is affected). Used after a router restart.
        ``tiers``: the blocks held only off the device (``_snapshot_tiers``; only the precise
        index keeps them)."""
        self._clear(replica_id)  # lanes unknown from here on, until the lanes' events say
        lru = self._lru[replica_id]
        for block_hash in block_hashes:
            if block_hash not in lru:
                lru[block_hash] = None
                self._owners.setdefault(block_hash, set()).add(replica_id)
        self._snapshot_tiers(replica_id, tiers)
        self._evict_to(replica_id, lru, self._capacity[replica_id])

    def _snapshot_tiers(self, replica_id: str, tiers: Sequence[tuple[BlockHash, Tier]]) -> None:  # noqa: B027
        """Record a snapshot's off-device blocks before its eviction bound runs (no-op here: only
        the precise index keeps tiers)."""

    # ----- shared mechanics -----------------------------------------------------------------
    def _store(self, replica_id: str, block_hashes: Sequence[BlockHash], lane: int | None = None) -> None:
        """Insert or refresh blocks, last block first so the prompt head ends most recent.
        ``lane``: the lane that stored them (None: lanes unknown, so every lane)."""
        lru = self._lru[replica_id]
        owners_of = self._owners
        lanes_of = self._lanes[replica_id]
        if lane is not None and lane != 0:
            self._multi_lane.add(replica_id)
        for block_hash in reversed(block_hashes):
            if block_hash in lru:
                lru.move_to_end(block_hash)
                if lane is None:
                    lanes_of.pop(block_hash, None)
                elif (mask := lanes_of.get(block_hash)) is not None:
                    lanes_of[block_hash] = mask | (1 << lane)
            else:
                lru[block_hash] = None
                if lane is not None:
                    lanes_of[block_hash] = 1 << lane
                owners = owners_of.get(block_hash)
                if owners is None:
                    owners_of[block_hash] = {replica_id}
                else:
                    owners.add(replica_id)
        self._evict_to(replica_id, lru, self._capacity[replica_id])

    def _remove(self, replica_id: str, block_hashes: Iterable[BlockHash], lane: int | None = None) -> None:
        """Drop blocks from ``lane`` (None: from every lane); a block no lane holds leaves."""
        lru = self._lru[replica_id]
        lanes_of = self._lanes[replica_id]
        for block_hash in block_hashes:
            mask = lanes_of.get(block_hash)
            if lane is not None and mask is not None:
                mask &= ~(1 << lane)
                if mask:
                    lanes_of[block_hash] = mask
                    continue
            lanes_of.pop(block_hash, None)
            if lru.pop(block_hash, 0) is None:  # present (values are None; absent -> 0)
                self._disown(block_hash, replica_id)

    def _clear(self, replica_id: str) -> None:
        lru = self._lru[replica_id]
        for block_hash in lru:
            self._disown(block_hash, replica_id)
        lru.clear()
        self._lanes[replica_id].clear()

    def _evict_to(self, replica_id: str, lru: OrderedDict[BlockHash, None], capacity: int) -> None:
        lanes_of = self._lanes[replica_id]
        while len(lru) > capacity:
            block_hash, _ = lru.popitem(last=False)
            lanes_of.pop(block_hash, None)
            self._disown(block_hash, replica_id)

    def _disown(self, block_hash: BlockHash, replica_id: str) -> None:
        owners = self._owners.get(block_hash)
        if owners is not None:
            owners.discard(replica_id)
            if not owners:
                del self._owners[block_hash]


class ApproximatePrefixIndex(PrefixIndex):
    """Learns from routing: what was sent to a replica is assumed cached there (LRU-bounded).

    Every replica's set is prefix-closed here: a block is only ever inserted or touched together
    with all its ancestors, and the ancestors are touched after it, so an ancestor is always more
    recent than its descendants and is never evicted first. ``match`` uses that to gallop.
    """

    mode = "approximate"

    def match(self, block_hashes: Sequence[BlockHash], candidates: Set[str]) -> dict[str, int]:
        """As ``PrefixIndex.match``, but with exponential + binary search over the prompt: "all
        still-matching replicas hold block j" is monotone in j for prefix-closed sets, so a long
        shared prefix costs O(log blocks) subset tests per distinct match length, not one per
        block."""
        matched: dict[str, int] = {}
        num_blocks = len(block_hashes)
        owners_of = self._owners
        active = self._first_block_holders(block_hashes, candidates)

        def all_hold(j: int) -> bool:
            owners = owners_of.get(block_hashes[j])
            return owners is not None and active <= owners

        lo = 0  # invariant: every active replica holds blocks 0..lo
        while active:
            step = 1  # exponential search for the last j with all_hold(j), then binary search
            while lo + step < num_blocks and all_hold(lo + step):
                lo += step
                step *= 2
            hi = min(lo + step, num_blocks)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if all_hold(mid):
                    lo = mid
                else:
                    hi = mid
            if lo + 1 >= num_blocks:
                break
            owners = owners_of.get(block_hashes[lo + 1])
            still = active & owners if owners is not None else set()
            for replica_id in active - still:
                matched[replica_id] = lo + 1
            active = still
            lo += 1
        for replica_id in active:
            matched[replica_id] = num_blocks
        return self._narrow_to_one_lane(block_hashes, matched)

    def on_routed(self, replica_id: str, block_hashes: Sequence[BlockHash]) -> None:
        self._store(replica_id, block_hashes)

    def apply_events(self, replica_id: str, events: Iterable[KVEvent]) -> None:
        self._lru[replica_id]  # unknown replica -> KeyError, as documented; events are ignored
