"""The ``Engine`` protocol: what a replica wraps, both engine kinds alike (the TT mesh engine and
the vLLM slice engine)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from accel.contract.output import OutputDelta
from accel.contract.request import GenerateRequest
from accel.contract.stats import EngineStats


@runtime_checkable
class Engine(Protocol):
    """``generate`` yields deltas until one has ``finish_reason`` set; ``abort`` ends a request
    early (its last delta has ``FinishReason.ABORT``) and frees its KV."""

    def generate(self, request: GenerateRequest) -> AsyncIterator[OutputDelta]: ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    async def shutdown(self) -> None: ...
