"""vLLM's scheduler stats, collected into our ``EngineStats`` through a custom stat logger.

``AsyncLLM`` pushes a ``SchedulerStats`` to every stat logger after each engine step (its output
handler calls ``StatLoggerManager.record``). A ``StatLoggerBase`` passed via ``stat_loggers`` is
the public way to see them: vLLM builds it from a factory ``(vllm_config, engine_index)``, so we
hand it a factory bound to a ``SchedulerStatsSink`` the engine reads from. The same logger reports
the KV cache size once the engine is up (``log_engine_initialized``).

``SchedulerStats``/``PrefixCacheStats`` are not stable vLLM interfaces; everything read from them
is in ``SchedulerStatsSink.record``. Prefix-cache counts arrive per step and are summed here
(cumulative token counts, vLLM's units, as ``EngineStats`` expects).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from accel.contract import EngineStats

if TYPE_CHECKING:
    from vllm.v1.metrics.loggers import StatLoggerBase

logger = logging.getLogger(__name__)


@dataclass
class SchedulerStatsSink:
    """Latest scheduler snapshot and cumulative prefix-cache counters of one engine. Written by
    vLLM's output handler, read by ``VllmEngine.stats()``; a lock keeps snapshots consistent."""

    platform: str
    num_waiting: int = 0
    num_running: int = 0
    kv_cache_usage: float = 0.0  # fraction of KV blocks in use, 0..1
    num_kv_blocks_total: int = 0
    prefix_cache_queries: int = 0  # tokens looked up in the prefix cache, cumulative
    prefix_cache_hits: int = 0  # of which found, cumulative
    # speculative decoding per step, summed (vLLM's SpecDecodingStats; what vllm:spec_decode_* count)
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def record(self, scheduler_stats: Any) -> None:
        with self._lock:
            self.num_waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
            self.num_running = scheduler_stats.num_running_reqs
            self.kv_cache_usage = float(scheduler_stats.kv_cache_usage)
            pc = scheduler_stats.prefix_cache_stats
            if pc is not None:
                self.prefix_cache_queries += pc.queries
                self.prefix_cache_hits += pc.hits
            spec = getattr(scheduler_stats, "spec_decoding_stats", None)
            if spec is not None:
                self.spec_decode_num_drafts += spec.num_drafts
                self.spec_decode_num_draft_tokens += spec.num_draft_tokens
                self.spec_decode_num_accepted_tokens += spec.num_accepted_tokens

    def set_num_kv_blocks(self, num_blocks: int) -> None:
        with self._lock:
            self.num_kv_blocks_total = num_blocks

    def snapshot(self) -> EngineStats:
        with self._lock:
            total = self.num_kv_blocks_total
            used = min(total, round(self.kv_cache_usage * total))
            return EngineStats(
                num_waiting=self.num_waiting,
                num_running=self.num_running,
                num_kv_blocks_total=total,
                num_kv_blocks_free=total - used,
                prefix_cache_queries=self.prefix_cache_queries,
                prefix_cache_hits=self.prefix_cache_hits,
                platform=self.platform,
                spec_decode_num_drafts=self.spec_decode_num_drafts,
                spec_decode_num_draft_tokens=self.spec_decode_num_draft_tokens,
                spec_decode_num_accepted_tokens=self.spec_decode_num_accepted_tokens,
            )


def sink_stat_logger_factory(sink: SchedulerStatsSink) -> type[StatLoggerBase]:
    """A vLLM per-engine stat-logger factory feeding ``sink``. Imports vLLM when called."""
    from vllm.v1.metrics.loggers import StatLoggerBase  # deferred: importing this module must not import vLLM

    class _SinkStatLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self._vllm_config = vllm_config
            self._engine_index = engine_index

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            if scheduler_stats is not None:
                sink.record(scheduler_stats)

        def log_engine_initialized(self) -> None:
            cache = self._vllm_config.cache_config
            num_blocks = int(cache.num_gpu_blocks or 0)
            sink.set_num_kv_blocks(num_blocks)
            logger.info(
                "vLLM engine %d ready on %s: %d KV blocks x %d tokens (%d tokens of KV)",
                self._engine_index,
                sink.platform,
                num_blocks,
                cache.block_size,
                num_blocks * cache.block_size,
            )

    return _SinkStatLogger
