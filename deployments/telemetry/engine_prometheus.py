"""vLLM 0.32's ``vllm:*`` metrics, kept by an engine replica whose engine does not register vLLM's
own (the TT mesh engine, or any engine a test injects), in a ``prometheus_client`` registry of
the replica's own; ``snapshot()`` is what ``EngineReplica.metrics_snapshot`` returns for it.

Names, label names (``model_name``, ``engine``; ``finished_reason``, ``reason``,
``sleep_state``), documentation and buckets are vLLM's (``vllm/v1/metrics/loggers.py`` and
``buckets.py``), so the ingress sums a TT replica's series with a vLLM replica's. Only what the
replica measures is exported: vLLM's queue / prefill / inference phase times need the engine's
scheduling timestamps, which the TT engine does not report, so those histograms are not here.
The TT engine's step statistics come under ``meshserve:`` (steps by mode, sampled tokens by
where, lane occupancy, async overlap), as ``metrics.EngineMetrics`` sends them to Ray.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from accel.contract import EngineStats, FinishReason, TTEngineStats
from deployments.telemetry.snapshot import MetricsSnapshot, registry_snapshot

ENGINE_INDEX = "0"  # one engine per replica: vLLM's label for a single engine

# vLLM 0.32's bucket families (vllm/v1/metrics/buckets.py).
TTFT_BUCKETS_S: tuple[float, ...] = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5)
TTFT_BUCKETS_S += (5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S: tuple[float, ...] = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
ITL_BUCKETS_S += (7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS_S: tuple[float, ...] = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0)
LATENCY_BUCKETS_S += (60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


def request_tokens_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's ``build_1_2_5_buckets(max_model_len)``: 1, 2, 5, 10, 20, 50, ... up to it."""
    out: list[float] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return tuple(out)
            out.append(float(mantissa * scale))
        scale *= 10


class EnginePrometheus:
    """One replica's ``vllm:*`` (and TT ``meshserve:*``) series for ``model_name``."""

    def __init__(self, model_name: str, max_model_len: int):
        self.registry = CollectorRegistry(auto_describe=True)
        self._values = (model_name, ENGINE_INDEX)
        self._last = EngineStats(0, 0, 0, 0)
        self._last_tt = TTEngineStats()
        self._build_gauges()
        self._build_counters()
        self._build_histograms(request_tokens_buckets(max_model_len))
        self._build_tt()
        self._create_series()
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            self.sleep_state.labels(*self._values, state).set(value)  # the TT engine never sleeps

    def _create_series(self) -> None:
        """Every series vLLM creates at start, at zero, so a scrape before any request shows them."""
        plain: list[Gauge | Counter | Histogram] = [self.running, self.waiting, self.kv_usage, self.async_overlap]
        plain += [self.prefix_queries, self.prefix_hits, self.prompt_tokens, self.generation_tokens]
        plain += [self.cached_tokens, self.computed_len, self.max_tokens]
        plain += [self.prompt_len, self.output_len, self.ttft, self.itl, self.tpot, self.e2e, self.decode]
        for metric in plain:
            metric.labels(*self._values)
        for reason in FinishReason:
            self.success.labels(*self._values, reason.value)
        for waiting in ("capacity", "deferred"):
            self.waiting_by_reason.labels(*self._values, waiting)

    def _gauge(self, name: str, doc: str, *extra: str) -> Gauge:
        return Gauge(name, doc, ["model_name", "engine", *extra], registry=self.registry)

    def _counter(self, name: str, doc: str, *extra: str) -> Counter:
        return Counter(name, doc, ["model_name", "engine", *extra], registry=self.registry)

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(name, doc, ["model_name", "engine"], buckets=buckets, registry=self.registry)

    def _build_gauges(self) -> None:
        self.running = self._gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = self._gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.waiting_by_reason = self._gauge(
            "vllm:num_requests_waiting_by_reason", "Number of waiting requests by reason.", "reason"
        )
        self.sleep_state = self._gauge("vllm:engine_sleep_state", "Engine sleep state.", "sleep_state")
        self.kv_usage = self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")

    def _build_counters(self) -> None:
        self.prefix_queries = self._counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = self._counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.prompt_tokens = self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = self._counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.cached_tokens = self._counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local prefix cache hits)."
        )
        self.success = self._counter(
            "vllm:request_success", "Count of successfully processed requests.", "finished_reason"
        )

    def _build_histograms(self, tokens: tuple[float, ...]) -> None:
        self.prompt_len = self._histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens)
        self.computed_len = self._histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tokens,
        )
        self.max_tokens = self._histogram(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tokens
        )
        self.output_len = self._histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.ttft = self._histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS_S
        )
        self.itl = self._histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS_S
        )
        self.tpot = self._histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS_S,
        )
        self.e2e = self._histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", LATENCY_BUCKETS_S
        )
        self.decode = self._histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            LATENCY_BUCKETS_S,
        )

    def _build_tt(self) -> None:
        self.steps = self._counter("meshserve:engine_steps", "TT engine steps by mode.", "mode")
        self.sampled = self._counter("meshserve:sampled_tokens", "Sampled tokens by where sampling ran.", "where")
        self.lane_occupancy = self._gauge("meshserve:lane_occupancy", "Busy decode slots / slots, per lane.", "lane")
        self.async_overlap = self._gauge(
            "meshserve:async_overlap_fraction", "Fraction of decode steps whose host work overlapped device work."
        )

    # -- observations (the replica's request path and stats loop) -------------------------------

    def observe_first_token(self, ttft_s: float) -> None:
        self.ttft.labels(*self._values).observe(ttft_s)

    def observe_delta(self, gap_s: float, num_tokens: int) -> None:
        """vLLM observes one inter-token latency per token; a delta of ``num_tokens`` tokens
        after ``gap_s`` is that many gaps of ``gap_s / num_tokens``."""
        itl = self.itl.labels(*self._values)
        for _ in range(num_tokens):
            itl.observe(gap_s / num_tokens)

    def observe_finish(
        self,
        reason: FinishReason,
        num_prompt: int,
        num_output: int,
        e2e_s: float,
        ttft_s: float | None,
        num_cached: int = 0,
        max_tokens: int | None = None,
    ) -> None:
        """A finished request; ``num_cached``: its prompt tokens found in the prefix cache;
        ``max_tokens``: its parameter (vLLM observes it when set)."""
        v = self._values
        self.success.labels(*v, reason.value).inc()
        self.prompt_tokens.labels(*v).inc(num_prompt)
        self.cached_tokens.labels(*v).inc(num_cached)
        self.computed_len.labels(*v).observe(num_prompt - max(num_cached, 0))
        if max_tokens:
            self.max_tokens.labels(*v).observe(max_tokens)
        self.generation_tokens.labels(*v).inc(num_output)
        self.prompt_len.labels(*v).observe(num_prompt)
        self.output_len.labels(*v).observe(num_output)
        self.e2e.labels(*v).observe(e2e_s)
        decode_s = e2e_s - ttft_s if ttft_s is not None else 0.0
        self.decode.labels(*v).observe(decode_s)
        self.tpot.labels(*v).observe(decode_s / (num_output - 1) if num_output > 1 else 0.0)

    def observe_stats(self, stats: EngineStats, tt: TTEngineStats | None = None) -> None:
        v = self._values
        self.running.labels(*v).set(stats.num_running)
        self.waiting.labels(*v).set(stats.num_waiting)
        self.waiting_by_reason.labels(*v, "capacity").set(stats.num_waiting)
        self.waiting_by_reason.labels(*v, "deferred").set(0)
        self.kv_usage.labels(*v).set(stats.kv_usage)
        self.prefix_queries.labels(*v).inc(max(0, stats.prefix_cache_queries - self._last.prefix_cache_queries))
        self.prefix_hits.labels(*v).inc(max(0, stats.prefix_cache_hits - self._last.prefix_cache_hits))
        self._last = stats
        if tt is not None:
            self._observe_tt(tt)

    def _observe_tt(self, tt: TTEngineStats) -> None:
        v, last = self._values, self._last_tt
        self.steps.labels(*v, "prefill").inc(max(0, tt.num_prefill_steps - last.num_prefill_steps))
        self.steps.labels(*v, "decode").inc(max(0, tt.num_decode_steps - last.num_decode_steps))
        self.sampled.labels(*v, "device").inc(max(0, tt.num_device_sampled_tokens - last.num_device_sampled_tokens))
        self.sampled.labels(*v, "host").inc(max(0, tt.num_host_sampled_tokens - last.num_host_sampled_tokens))
        for lane, occupancy in enumerate(tt.lane_occupancy):
            self.lane_occupancy.labels(*v, str(lane)).set(occupancy)
        self.async_overlap.labels(*v).set(tt.async_overlap_fraction)
        self._last_tt = tt

    def snapshot(self) -> MetricsSnapshot:
        return registry_snapshot(self.registry, ("vllm:", "meshserve:"))
