"""One lane's paged-KV block allocator with prefix caching.

Invariants:
- a block is either referenced (``ref_count > 0``, owned by running requests) or in the free
  queue; the free queue is LRU-ordered (oldest first) and may hold *cached* blocks (those with a
  hash): they keep their KV until reused, so a later request with the same prefix can take them
  back (``touch``) instead of recomputing;
- ``_cached`` maps a chained block hash (``accel.block_hash``) to the one block holding it;
  allocation evicts the oldest free block and drops its hash (a ``removed`` ``PrefixCacheChange``);
- block ids are lane-local (``0..num_blocks-1``); every lane has its own allocator.

Pure logic: no torch, no threads. The engine thread is the only caller.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from accel.block_hash import BlockHash
from accel.contract import PrefixCacheChange


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool, lane: int = 0):
        assert num_blocks > 0 and block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.lane = lane
        self._ref_counts = [0] * num_blocks
        self._hashes: list[BlockHash | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[BlockHash, int] = {}
        self._events: list[PrefixCacheChange] = []
        self.prefix_cache_queries = 0  # tokens looked up (cumulative)
        self.prefix_cache_hits = 0  # of which found cached

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def find_cached_prefix(self, block_hashes: Sequence[BlockHash]) -> list[int]:
        """Blocks holding the longest cached prefix of ``block_hashes`` (refs untouched)."""
        hit: list[int] = []
        if not self.enable_prefix_caching:
            return hit
        for h in block_hashes:
            block = self._cached.get(h)
            if block is None:
                break
            hit.append(block)
        return hit

    def record_prefix_query(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_cache_queries += num_query_tokens
        self.prefix_cache_hits += num_hit_tokens

    def num_free_after_touch(self, block_ids: Sequence[int]) -> int:
        """Free blocks left once ``block_ids`` (cache hits) are taken out of the free queue."""
        return len(self._free) - sum(1 for b in block_ids if self._ref_counts[b] == 0)

    def touch(self, block_ids: Sequence[int]) -> None:
        """Take a reference on cache-hit blocks (pulling free ones out of the LRU queue)."""
        for b in block_ids:
            if self._ref_counts[b] == 0:
                del self._free[b]
            self._ref_counts[b] += 1

    def allocate(self, num: int) -> list[int]:
        """``num`` fresh blocks (ref 1), evicting the least recently freed cached blocks."""
        if num > len(self._free):
            raise RuntimeError(f"lane {self.lane}: {num} blocks requested, {len(self._free)} free")
        out: list[int] = []
        evicted: list[BlockHash] = []
        for _ in range(num):
            b, _ = self._free.popitem(last=False)
            h = self._hashes[b]
            if h is not None:
                self._hashes[b] = None
                if self._cached.get(h) == b:
                    del self._cached[h]
                    evicted.append(h)
            self._ref_counts[b] = 1
            out.append(b)
        if evicted:
            self._events.append(PrefixCacheChange("removed", self.lane, tuple(evicted)))
        return out

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference per block. Freed in reverse so a request's tail blocks (the least
        likely to be shared) are evicted first."""
        for b in reversed(block_ids):
            self._ref_counts[b] -= 1
            assert self._ref_counts[b] >= 0, f"block {b} freed twice"
            if self._ref_counts[b] == 0:
                self._free[b] = None

    def cache_blocks(self, block_ids: Sequence[int], block_hashes: Sequence[BlockHash]) -> None:
        """Register full, computed blocks under their chained hashes (a ``stored`` change).

        A hash already held by another block is left alone (the duplicate simply is not
        cached); a block that already has a hash keeps it.
        """
        if not self.enable_prefix_caching:
            return
        stored: list[BlockHash] = []
        for b, h in zip(block_ids, block_hashes):
            if self._hashes[b] is not None or h in self._cached:
                continue
            self._hashes[b] = h
            self._cached[h] = b
            stored.append(h)
        if stored:
            self._events.append(PrefixCacheChange("stored", self.lane, tuple(stored)))

    def take_kv_events(self) -> list[PrefixCacheChange]:
        events, self._events = self._events, []
        return events

    def cached_block_hashes(self) -> list[BlockHash]:
        """The prefix cache's hashes, least recently used first: cached free blocks in eviction
        order, then cached blocks in use. Safe to call from another thread (C-level copies of
        the containers; a stale entry only costs the router one approximate block)."""
        hashes, free = list(self._hashes), list(self._free)
        in_free = set(free)
        out = [h for b in free if (h := hashes[b]) is not None]
        out += [h for b, h in enumerate(hashes) if h is not None and b not in in_free]
        return out

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]
