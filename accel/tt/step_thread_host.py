"""``StepThreadHost``: the TT engine's step loop on ONE background thread of this process (no
process per lane). The thread owns every piece of scheduling state; the asyncio side only posts
inbox messages to it and reads what it delivers.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import torch

from accel.block_hash import BlockHash
from accel.contract import EngineStats, GenerateRequest, PrefixCacheChange, TTEngineStats
from accel.tt.core_messages import InboxMessage
from accel.tt.engine_parts import EngineParts, lane_block_snapshot
from accel.tt.request_streams import RequestStreams
from accel.tt.step_loop import StepLoop

logger = logging.getLogger(__name__)


class StepThreadHost:
    """A ``StepLoopHost`` over ``parts`` built in this process (``build_engine_parts``)."""

    def __init__(self, parts: EngineParts, step_timeout_s: float):
        self.parts = parts
        self.step_timeout_s = step_timeout_s
        self.tokenizer = parts.tokenizer
        self.vocab_size = parts.vocab_size
        self.vision = parts.vision
        self.platform = parts.platform
        self.num_blocks_per_lane = parts.num_blocks_per_lane
        self._loop: StepLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def loop(self) -> StepLoop:
        assert self._loop is not None, "start() first"
        return self._loop

    @property
    def can_transfer_kv(self) -> bool:
        return self.parts.core.kv_hooks is not None

    @property
    def pid(self) -> int | None:
        return None

    @property
    def torch_threads(self) -> int:
        return torch.get_num_threads()

    @property
    def num_busy_iterations(self) -> int:
        return self.loop.num_busy_iterations

    @property
    def host_busy_s(self) -> float:
        return self.loop.host_busy_s

    def start(self, streams: RequestStreams) -> None:
        self._loop = StepLoop(self.parts.core, self.parts.grammars, self.platform, streams.deliver)
        self._thread = threading.Thread(target=self._loop.run, name="tt-mesh-engine", daemon=True)
        self._thread.start()

    async def admit(self, request: GenerateRequest) -> Any:
        """Structured-output grammars compile here (and are cached), KV imports prefetch their
        RPCs: both off the step thread."""
        grammar = None
        if request.sampling.structured_outputs is not None:
            grammar = await self.parts.grammars.compile(request.sampling.structured_outputs)
        hooks = self.parts.core.kv_hooks
        if request.kv_transfer is not None and hooks is not None:
            await hooks.prefetch(request)
        return grammar

    def post(self, message: InboxMessage) -> None:
        self.loop.post(message)

    def stats(self) -> EngineStats:
        return self.loop.stats

    def extra_stats(self) -> TTEngineStats:
        return self.loop.extra_stats

    def take_kv_events(self) -> list[PrefixCacheChange]:
        return self.loop.take_kv_events()

    def kv_block_snapshot(self) -> list[BlockHash]:
        return lane_block_snapshot(self.parts.core)

    async def health_problem(self) -> str | None:
        """The step loop's stall check and the device probe (``accel.tt.health``); never blocks."""
        if self.loop.is_stopped or self._thread is None or not self._thread.is_alive():
            return "the TT mesh engine's step loop is not running"
        return self.loop.health_problem(self.step_timeout_s, self.parts.device_probe)

    def stop(self) -> None:
        self.loop.stop()
        assert self._thread is not None
        self._thread.join(timeout=self.step_timeout_s)
        if self._thread.is_alive():  # hung in a forward: leave the model to the process's exit
            logger.error("TT mesh engine: the step loop did not stop within %.0f s", self.step_timeout_s)
            return
        self.parts.close()
