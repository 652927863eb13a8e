"""What an engine reports besides its outputs: ``EngineStats``, its load and cache snapshot (read by
the router and the metrics)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    """Load and cache snapshot. Prefix-cache counters are cumulative token counts (vLLM's units)."""

    num_waiting: int
    num_running: int
    num_kv_blocks_total: int
    num_kv_blocks_free: int
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    platform: str = ""

    @property
    def kv_usage(self) -> float:
        if self.num_kv_blocks_total == 0:
            return 0.0
        return 1.0 - self.num_kv_blocks_free / self.num_kv_blocks_total
