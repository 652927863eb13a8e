"""KV-cache events an engine publishes about its prefix cache, in the router's hash space.

Spelled after vLLM's ``vllm.distributed.kv_events`` (``BlockStored``, ``BlockRemoved``,
``AllBlocksCleared``), but every hash is an ``accel.block_hash`` chained hash, so the router's
index and every engine agree on keys across processes. The TT engine publishes these directly; an
adapter for vLLM's events recomputes our hashes from ``BlockStored.token_ids`` and the parent
(vLLM's own hashes are seeded per deployment and are not ours). ``KVCursor`` is a reader's place
in one replica's event log (``deployments.replicas.kv_event_log``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from accel.block_hash import BlockHash

# Where an engine holds a block, fastest first: its device KV cache, host DRAM (vLLM's
# ``OffloadingConnector`` medium "CPU"), or slower storage (disk, a remote store). A block on a
# slower tier is loaded back instead of recomputed, which still costs a transfer.
Tier = Literal["device", "host", "storage"]


@dataclass(frozen=True)
class BlockStored:
    """Full blocks the engine now holds, in chain order (block i's parent is block i-1).
    ``lane``: the engine's cache domain that stored them (a TT lane; like vLLM's
    ``KVEventBatch.data_parallel_rank``); 0 for an engine with one cache. ``tier``: the fastest
    tier now holding them; a held block is reported again when that changes (copied to a faster
    tier, or left only on a slower one after the device evicted it)."""

    block_hashes: tuple[BlockHash, ...]
    lane: int = 0
    tier: Tier = "device"


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks the engine's ``lane`` evicted; they no longer give prefix hits there."""

    block_hashes: tuple[BlockHash, ...]
    lane: int = 0


@dataclass(frozen=True)
class AllBlocksCleared:
    """The engine dropped its whole prefix cache (``reset_prefix_cache``, restart)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class KVCursor:
    """Where a reader stands in one replica's log: it has applied every event up to ``seq``."""

    log_id: str
    seq: int
