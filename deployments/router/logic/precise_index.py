"""``PrecisePrefixIndex``: the prefix index that follows the engines' KV events (``precise`` mode),
with speculative entries for what was just routed (see ``prefix_index`` for the shared layout),
and the tier each block is held on (``BlockStored.tier``: device, or only a slower host/storage
tier the engine loads it back from), which ``credit`` weighs."""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence, Set

from accel.block_hash import BlockHash
from deployments.messages.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, Tier

from .prefix_index import PrefixIndex

TIER_BOUND_FACTOR = 8  # off-device blocks kept per replica, at most, in device capacities


class PrecisePrefixIndex(PrefixIndex):
    """Follows engine KV events, plus speculative entries for what was just routed (until the
    engine's events confirm them or ``speculative_ttl_s`` passes; 0 = none). Replicas marked as
    publishing no events (``set_event_driven(r, False)``) are learned from routing instead.

    Invariant: ``_speculative[r]`` holds the entries of ``r`` no event has confirmed yet, each
    with its expiry (and, until then, any the LRU bound dropped meanwhile); ``_expiries`` lists
    every (expiry, replica, hashes) recorded, in expiry order (one TTL, a monotonic clock); an
    entry is dropped at its expiry only if that is still its own (a later dispatch refreshes it).
    The LRU bound counts confirmed device entries: guesses and blocks held only on a slower tier
    (``_tiers[r]``, every key in ``_lru[r]``) ride on top of the engine's device capacity."""

    mode = "precise"

    def __init__(self, clock: Callable[[], float] = time.monotonic, speculative_ttl_s: float = 0.0) -> None:
        super().__init__()
        self._learned: set[str] = set()  # replicas without KV events
        self._clock = clock
        self._ttl_s = speculative_ttl_s
        self._speculative: dict[str, dict[BlockHash, float]] = {}  # replica -> hash -> expiry
        self._expiries: deque[tuple[float, str, tuple[BlockHash, ...]]] = deque()
        self._tiers: dict[str, dict[BlockHash, Tier]] = {}  # replica -> blocks not on its device

    def match(self, block_hashes: Sequence[BlockHash], candidates: Set[str]) -> dict[str, int]:
        self._expire()
        return super().match(block_hashes, candidates)

    def credit(
        self, block_hashes: Sequence[BlockHash], matched: Mapping[str, int], tier_credit: Mapping[Tier, float]
    ) -> dict[str, float]:
        credited: dict[str, float] = {}
        for replica_id, n in matched.items():
            tiers = self._tiers.get(replica_id)
            if not tiers:
                credited[replica_id] = float(n)
                continue
            credited[replica_id] = sum(
                tier_credit[tier] if (tier := tiers.get(h)) is not None else 1.0 for h in block_hashes[:n]
            )
        return credited

    def tier_of(self, replica_id: str, block_hash: BlockHash) -> Tier | None:
        """The fastest tier ``replica_id`` holds ``block_hash`` on (None: not held)."""
        if block_hash not in self._lru[replica_id]:
            return None
        return self._tiers.get(replica_id, {}).get(block_hash, "device")

    def num_speculative(self, replica_id: str) -> int:
        """Entries of ``replica_id`` recorded at dispatch and not yet confirmed by its events."""
        self._expire()
        return len(self._speculative.get(replica_id, ()))

    def set_event_driven(self, replica_id: str, is_event_driven: bool) -> None:
        super().set_event_driven(replica_id, is_event_driven)
        if is_event_driven:
            self._learned.discard(replica_id)
        else:
            self._learned.add(replica_id)

    def remove_replica(self, replica_id: str) -> None:
        super().remove_replica(replica_id)
        self._learned.discard(replica_id)
        self._speculative.pop(replica_id, None)
        self._tiers.pop(replica_id, None)

    def apply_snapshot(
        self, replica_id: str, block_hashes: Sequence[BlockHash], tiers: Sequence[tuple[BlockHash, Tier]] = ()
    ) -> None:
        self._speculative.pop(replica_id, None)  # the snapshot is the engine's whole truth
        super().apply_snapshot(replica_id, block_hashes, tiers)

    def _snapshot_tiers(self, replica_id: str, tiers: Sequence[tuple[BlockHash, Tier]]) -> None:
        lru = self._lru[replica_id]
        held = self._tiers.setdefault(replica_id, {})
        for block_hash, tier in tiers:
            if block_hash in lru and tier != "device":
                held[block_hash] = tier

    def on_routed(self, replica_id: str, block_hashes: Sequence[BlockHash]) -> None:
        if replica_id in self._learned:
            self._store(replica_id, block_hashes)
            return
        lru = self._lru[replica_id]  # unknown replica -> KeyError
        if self._ttl_s <= 0 or not block_hashes:
            return
        self._expire()
        spec = self._speculative.setdefault(replica_id, {})
        # Blocks the engine already reported stay as they are (their lanes, no expiry).
        guessed = tuple(h for h in block_hashes if h not in lru or h in spec)
        if not guessed:
            return
        expiry = self._clock() + self._ttl_s
        for block_hash in guessed:
            spec[block_hash] = expiry
        self._expiries.append((expiry, replica_id, guessed))
        self._store(replica_id, guessed)

    def apply_events(self, replica_id: str, events: Iterable[KVEvent]) -> None:
        self._expire()
        spec = self._speculative.get(replica_id)
        for event in events:
            if isinstance(event, BlockStored):
                if spec:  # confirmed: re-stored below as the engine says (its lane, no expiry)
                    confirmed = [h for h in event.block_hashes if spec.pop(h, None) is not None]
                    if confirmed:
                        self._remove(replica_id, confirmed)
                # The tier first: the store's eviction bound counts off-device blocks apart.
                self._set_tier(replica_id, event.block_hashes, event.tier)
                self._store(replica_id, event.block_hashes, event.lane)
            elif isinstance(event, BlockRemoved):
                if spec:
                    for block_hash in event.block_hashes:
                        spec.pop(block_hash, None)
                self._remove(replica_id, event.block_hashes, event.lane)
            elif isinstance(event, AllBlocksCleared):
                if spec:
                    spec.clear()
                self._clear(replica_id)
            else:
                raise TypeError(f"unknown KV event {event!r}")

    def _set_tier(self, replica_id: str, block_hashes: Sequence[BlockHash], tier: Tier) -> None:
        """Record the blocks' tier before ``_store`` inserts them (invariant after it: every key
        of ``_tiers[r]`` is in ``_lru[r]``; ``_disown`` drops the entries that leave)."""
        tiers = self._tiers.setdefault(replica_id, {})
        if tier == "device":
            for block_hash in block_hashes:
                tiers.pop(block_hash, None)
        else:
            for block_hash in block_hashes:
                tiers[block_hash] = tier

    def _evict_to(self, replica_id: str, lru: OrderedDict[BlockHash, None], capacity: int) -> None:
        # The bound is on what the engine reported on its device: guesses ride on top of it, so
        # recording one never pushes out a confirmed block the engine still holds (it would not
        # report it again). Blocks held only on a slower tier (whose size the engine does not
        # report) are neither counted nor evicted by it; their own safety net against lost
        # removal events is ``TIER_BOUND_FACTOR`` times the device capacity, oldest first.
        spec = self._speculative.get(replica_id)
        bound = capacity + (len(spec) if spec else 0)
        tiers = self._tiers.get(replica_id)
        if not tiers:
            super()._evict_to(replica_id, lru, bound)
            return
        while len(lru) - len(tiers) > bound:
            self._drop(replica_id, lru, next(h for h in lru if h not in tiers))
        while len(tiers) > TIER_BOUND_FACTOR * capacity:
            self._drop(replica_id, lru, next(iter(tiers)))

    def _drop(self, replica_id: str, lru: OrderedDict[BlockHash, None], block_hash: BlockHash) -> None:
        del lru[block_hash]
        self._lanes[replica_id].pop(block_hash, None)
        self._disown(block_hash, replica_id)

    def _disown(self, block_hash: BlockHash, replica_id: str) -> None:
        super()._disown(block_hash, replica_id)
        tiers = self._tiers.get(replica_id)
        if tiers:
            tiers.pop(block_hash, None)

    def _expire(self) -> None:
        """Drop the speculative entries whose time is up (and that nothing refreshed or confirmed)."""
        if not self._expiries:
            return
        now_s = self._clock()
        while self._expiries and self._expiries[0][0] <= now_s:
            expiry, replica_id, hashes = self._expiries.popleft()
            spec = self._speculative.get(replica_id)
            if not spec:
                continue
            stale = [h for h in hashes if spec.get(h) == expiry]
            for block_hash in stale:
                del spec[block_hash]
            if stale and replica_id in self._lru:
                self._remove(replica_id, stale)
