"""What an engine reports besides its outputs: ``EngineStats`` (every engine: load and cache, read
by the router and the metrics) and ``TTEngineStats`` (the TT mesh engine's step statistics, read
by the metrics only)."""

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
    # Speculative decoding, cumulative (vLLM's vllm:spec_decode_* counters; 0 without it).
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0

    @property
    def kv_usage(self) -> float:
        if self.num_kv_blocks_total == 0:
            return 0.0
        return 1.0 - self.num_kv_blocks_free / self.num_kv_blocks_total


@dataclass(frozen=True)
class TTEngineStats:
    """The TT mesh engine's ``extra_stats()``: how its steps ran (``deployments.telemetry.metrics`` turns them
    into the ``meshserve_engine_steps``, ``meshserve_sampled_tokens``, ``meshserve_lane_occupancy``
    and ``meshserve_async_overlap_fraction`` series). Counts are cumulative since the engine
    started; occupancy and overlap are current values."""

    num_prefill_steps: int = 0
    num_decode_steps: int = 0
    num_device_sampled_tokens: int = 0  # sampled inside the mesh program
    num_host_sampled_tokens: int = 0  # sampled on the host (logits read back)
    lane_occupancy: tuple[float, ...] = ()  # per lane (index = lane): running requests / slots, 0..1
    async_overlap_fraction: float = 0.0  # decode steps left in flight while the host worked / decode steps
