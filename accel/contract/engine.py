"""The ``Engine`` protocol: what a replica wraps, both engine kinds alike (the TT mesh engine and
the vLLM slice engine).

Every engine implements every method. A capability an engine lacks has a declared answer rather
than a missing attribute: ``extra_stats``, ``take_kv_events`` and ``kv_block_snapshot`` return
None ("not supported by this engine"), so a replica reads them without probing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from accel.block_hash import BlockHash
from accel.contract.output import OutputDelta
from accel.contract.pooling import EmbeddingResult, EmbedRequest
from accel.contract.request import GenerateRequest
from accel.contract.stats import EngineStats, TTEngineStats


@dataclass(frozen=True)
class PrefixCacheChange:
    """Block hashes (``accel.block_hash``, at the engine's block size) that entered (``stored``)
    or left (``removed``) an engine's prefix cache. ``lane``: the TT lane whose cache changed (an
    engine without lanes: 0). The replica turns these into the router's KV events."""

    kind: Literal["stored", "removed"]
    lane: int
    block_hashes: tuple[BlockHash, ...]


@runtime_checkable
class Engine(Protocol):
    """``generate`` yields deltas until one has ``finish_reason`` set; ``abort`` ends a request
    early (its last delta has ``FinishReason.ABORT``) and frees its KV."""

    @property
    def block_size(self) -> int:
        """Tokens per KV block of the engine's cache: the block size of the hashes that
        ``take_kv_events`` and ``kv_block_snapshot`` report."""
        ...

    def generate(self, request: GenerateRequest) -> AsyncIterator[OutputDelta]: ...

    async def abort(self, request_id: str) -> None: ...

    async def embed(self, request: EmbedRequest) -> EmbeddingResult:
        """The prompt's pooled embedding. An engine without vLLM's pooling runner raises
        ``InvalidRequestError`` naming ``model`` (and one with it refuses ``generate`` so)."""
        ...

    def stats(self) -> EngineStats: ...

    def extra_stats(self) -> TTEngineStats | None:
        """The TT mesh engine's step statistics; None for an engine that has none."""
        ...

    def take_kv_events(self) -> list[PrefixCacheChange] | None:
        """Prefix-cache changes since the previous call (each reported once); None when the
        engine publishes none this way (vLLM publishes its own over ZMQ: ``VllmReplica``)."""
        ...

    def kv_block_snapshot(self) -> list[BlockHash] | None:
        """Every block hash in the prefix cache now (the set ``take_kv_events`` changes), least
        recently used first; None when the engine has no such call."""
        ...

    async def check_health(self) -> None:
        """Raise if the engine cannot serve (its step loop or engine core is gone)."""
        ...

    async def shutdown(self) -> None: ...
