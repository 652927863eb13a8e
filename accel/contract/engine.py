"""The ``Engine`` protocol: what a replica wraps, both engine kinds alike (the TT mesh engine and
the vLLM slice engine)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from accel.block_hash import BlockHash
from accel.contract.output import OutputDelta
from accel.contract.request import GenerateRequest
from accel.contract.stats import EngineStats


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

    def generate(self, request: GenerateRequest) -> AsyncIterator[OutputDelta]: ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    async def shutdown(self) -> None: ...
