"""Host-memory prefix tier: full KV blocks kept by chained block hash, shared by all replicas.

A replica that computed a prefix offers its full blocks; a replica that lacks a prefix asks for
the longest run of leading blocks the tier holds and imports them instead of recomputing.
Entries are keyed by (model fingerprint, block size, chained block hash) — the hash of block
``i`` pins blocks ``0..i`` — and evicted least-recently-used past ``capacity_bytes``. Payloads are
opaque (Ray ``ObjectRef``s in the actor), one per block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from accel.block_hash import BlockHash

BlockKey = tuple[str, int, BlockHash]  # (model fingerprint, block_size, chained hash)


@dataclass(frozen=True)
class PrefixTierStats:
    num_blocks: int
    num_bytes_used: int
    capacity_bytes: int
    num_hits: int  # blocks served
    num_queries: int  # blocks asked for
    num_evicted: int


class KVPrefixTier:
    def __init__(self, capacity_bytes: int):
        self.capacity_bytes = capacity_bytes
        self._blocks: OrderedDict[BlockKey, tuple[Any, int]] = OrderedDict()
        self._num_bytes_used = 0
        self._num_hits = self._num_queries = self._num_evicted = 0

    def offer(
        self,
        fingerprint: str,
        block_size: int,
        hashes: Sequence[BlockHash],
        payloads: Sequence[Any],
        num_bytes_per_block: int,
    ) -> int:
        """Keep blocks the tier lacks; returns how many were added. Blocks larger than the whole
        tier are ignored (the tier is a cache: refusing is not a loss)."""
        added = 0
        for block_hash, payload in zip(hashes, payloads):
            key = (fingerprint, block_size, block_hash)
            if key in self._blocks:
                self._blocks.move_to_end(key)
                continue
            if num_bytes_per_block > self.capacity_bytes:
                break
            while self._num_bytes_used + num_bytes_per_block > self.capacity_bytes:
                _, (_, freed) = self._blocks.popitem(last=False)
                self._num_bytes_used -= freed
                self._num_evicted += 1
            self._blocks[key] = (payload, num_bytes_per_block)
            self._num_bytes_used += num_bytes_per_block
            added += 1
        return added

    def match(self, fingerprint: str, block_size: int, hashes: Sequence[BlockHash]) -> list[Any]:
        """Payloads of the longest run of leading blocks held (stops at the first miss)."""
        found = []
        self._num_queries += len(hashes)
        for block_hash in hashes:
            key = (fingerprint, block_size, block_hash)
            entry = self._blocks.get(key)
            if entry is None:
                break
            self._blocks.move_to_end(key)
            found.append(entry[0])
        self._num_hits += len(found)
        return found

    def stats(self) -> PrefixTierStats:
        return PrefixTierStats(
            len(self._blocks),
            self._num_bytes_used,
            self.capacity_bytes,
            self._num_hits,
            self._num_queries,
            self._num_evicted,
        )
