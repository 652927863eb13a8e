"""Prometheus metrics through ``ray.util.metrics`` (Ray exports them with a ``ray_`` prefix,
counters with ``_total``), so the Ray dashboard, Prometheus and ``docs/grafana/meshserve.json``
see them.

Engine metrics carry vLLM's names (``vllm_time_to_first_token_seconds`` -> exported
``ray_vllm_time_to_first_token_seconds``) and vLLM's buckets, so Ray's Serve-LLM dashboard works
on TT replicas too; every series is tagged ``model_name``, ``pool``, ``replica``. Ours are
``meshserve_*``. Emit from the process that owns the quantity (the replica actor for engine
metrics), so Ray's ``WorkerId`` tag joins with Serve's own per-replica series.
"""

from __future__ import annotations

from ray.util.metrics import Counter, Gauge, Histogram

from accel.contract import EngineStats, FinishReason, TTEngineStats
from deployments.telemetry.engine_prometheus import EnginePrometheus
from deployments.telemetry.ingress_prometheus import IngressPrometheus
from deployments.telemetry.router_prometheus import RouterPrometheus

ENGINE_TAGS = ("model_name", "pool", "replica")

# vLLM 0.32's buckets (vllm/v1/metrics/buckets.py).
TTFT_BUCKETS_S = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
ITL_BUCKETS_S = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
E2E_BUCKETS_S = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]
OCCUPANCY_BUCKETS = [0.1, 0.25, 0.5, 0.75, 0.9, 1.0]


class EngineMetrics:
    """Per-replica engine metrics; one instance per replica actor.

    ``observe_stats`` turns the engine's cumulative prefix-cache counters into counter
    increments and sets the gauges; the TT engine's step statistics (``TTEngineStats``, from its
    ``extra_stats()``; other engines have none) feed the ``meshserve_*`` engine series the same
    way: cumulative counts become increments, current values set gauges.

    ``prom``: the same observations as vLLM-named ``prometheus_client`` series of this replica
    (``EnginePrometheus``, read by ``GET /metrics``), when the engine does not register vLLM's
    own (``emit_vllm_metrics``); None otherwise.
    """

    def __init__(
        self, model_name: str, pool: str, replica: str, emit_vllm_metrics: bool = True, max_model_len: int = 2048
    ):
        self._tags = {"model_name": model_name, "pool": pool, "replica": replica}
        self.emit_vllm = emit_vllm_metrics
        self.prom = EnginePrometheus(model_name, max_model_len) if emit_vllm_metrics else None
        self._last_queries = 0
        self._last_hits = 0
        self._last_tt = TTEngineStats()  # counts already turned into increments
        t = ENGINE_TAGS
        self.ttft = Histogram("vllm_time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS_S, t)
        self.itl = Histogram(
            "vllm_inter_token_latency_seconds", "Time between output deltas, per token.", ITL_BUCKETS_S, t
        )
        self.tpot = Histogram(
            "vllm_request_time_per_output_token_seconds",
            "Per request: decode time / (output tokens - 1).",
            ITL_BUCKETS_S,
            t,
        )
        self.e2e = Histogram("vllm_e2e_request_latency_seconds", "Request latency in the replica.", E2E_BUCKETS_S, t)
        self.running = Gauge("vllm_num_requests_running", "Requests in the engine's running set.", t)
        self.waiting = Gauge("vllm_num_requests_waiting", "Requests waiting for admission.", t)
        self.kv_usage = Gauge("vllm_kv_cache_usage_perc", "KV cache usage, 0-1.", t)
        self.prompt_tokens = Counter("vllm_prompt_tokens", "Prompt tokens processed.", t)
        self.generation_tokens = Counter("vllm_generation_tokens", "Generation tokens produced.", t)
        self.prefix_queries = Counter("vllm_prefix_cache_queries", "Prefix cache queried tokens.", t)
        self.prefix_hits = Counter("vllm_prefix_cache_hits", "Prefix cache hit tokens.", t)
        self.success = Counter("vllm_request_success", "Finished requests by reason.", t + ("finished_reason",))
        # meshserve extras (TT engine step modes, lanes, sampling location, async overlap).
        self.step_mode = Counter("meshserve_engine_steps", "Engine steps by mode.", t + ("mode",))
        self.sampling = Counter("meshserve_sampled_tokens", "Sampled tokens by where sampling ran.", t + ("where",))
        self.lane_occupancy = Gauge("meshserve_lane_occupancy", "Busy decode slots / slots, per lane.", t + ("lane",))
        self.async_overlap = Gauge(
            "meshserve_async_overlap_fraction", "Fraction of decode steps whose host work overlapped device work.", t
        )

    def observe_first_token(self, ttft_s: float) -> None:
        if self.prom is not None:
            self.prom.observe_first_token(ttft_s)
        if self.emit_vllm:
            self.ttft.observe(ttft_s, self._tags)

    def observe_delta(self, gap_s: float, num_tokens: int) -> None:
        if self.prom is not None and num_tokens > 0:
            self.prom.observe_delta(gap_s, num_tokens)
        if self.emit_vllm and num_tokens > 0:
            self.itl.observe(gap_s / num_tokens, self._tags)

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
        if self.prom is not None:
            self.prom.observe_finish(reason, num_prompt, num_output, e2e_s, ttft_s, num_cached, max_tokens)
        if not self.emit_vllm:
            return
        self.e2e.observe(e2e_s, self._tags)
        self.prompt_tokens.inc(num_prompt, self._tags)
        if num_output:
            self.generation_tokens.inc(num_output, self._tags)
        if ttft_s is not None and num_output > 1:
            self.tpot.observe((e2e_s - ttft_s) / (num_output - 1), self._tags)
        self.success.inc(1, {**self._tags, "finished_reason": reason.value})

    def observe_stats(self, stats: EngineStats, tt: TTEngineStats | None = None) -> None:
        if self.prom is not None:
            self.prom.observe_stats(stats, tt)
        if self.emit_vllm:
            self.running.set(stats.num_running, self._tags)
            self.waiting.set(stats.num_waiting, self._tags)
            self.kv_usage.set(stats.kv_usage, self._tags)
            if stats.prefix_cache_queries > self._last_queries:
                self.prefix_queries.inc(stats.prefix_cache_queries - self._last_queries, self._tags)
            if stats.prefix_cache_hits > self._last_hits:
                self.prefix_hits.inc(stats.prefix_cache_hits - self._last_hits, self._tags)
            self._last_queries = max(self._last_queries, stats.prefix_cache_queries)
            self._last_hits = max(self._last_hits, stats.prefix_cache_hits)
        if tt is not None:
            self._observe_tt(tt)

    def _observe_tt(self, tt: TTEngineStats) -> None:
        last, tags = self._last_tt, self._tags
        for mode, gained in (
            ("prefill", tt.num_prefill_steps - last.num_prefill_steps),
            ("decode", tt.num_decode_steps - last.num_decode_steps),
        ):
            if gained > 0:
                self.step_mode.inc(gained, {**tags, "mode": mode})
        for where, gained in (
            ("device", tt.num_device_sampled_tokens - last.num_device_sampled_tokens),
            ("host", tt.num_host_sampled_tokens - last.num_host_sampled_tokens),
        ):
            if gained > 0:
                self.sampling.inc(gained, {**tags, "where": where})
        for lane, occupancy in enumerate(tt.lane_occupancy):
            self.lane_occupancy.set(occupancy, {**tags, "lane": str(lane)})
        self.async_overlap.set(tt.async_overlap_fraction, tags)
        self._last_tt = tt


class IngressMetrics:
    """Ingress-side counters: router fallbacks and rejected requests; the same counts as
    ``meshserve:*`` series of the ingress's ``GET /metrics`` (``prom``)."""

    def __init__(self) -> None:
        self.prom = IngressPrometheus()
        self.router_fallbacks = Counter(
            "meshserve_router_fallbacks", "Requests routed locally because the router did not answer.", ("reason",)
        )
        self.rejected = Counter(
            "meshserve_requests_rejected", "Requests refused before any engine.", ("model_name", "status")
        )
        self.inflight = Gauge("meshserve_ingress_requests_inflight", "Requests held by this ingress replica.")
        self.failovers = Counter(
            "meshserve_stream_failovers",
            "Streams continued on another replica after theirs died mid-stream, by model.",
            ("model_name",),
        )

    def failover(self, model: str) -> None:
        """One failover of a stream of ``model`` (a request failing over twice counts twice)."""
        self.failovers.inc(1, {"model_name": model})
        self.prom.failovers.labels(model).inc()

    def fallback(self, reason: str) -> None:
        self.router_fallbacks.inc(1, {"reason": reason})
        self.prom.router_fallbacks.labels(reason).inc()

    def reject(self, model: str, status: int) -> None:
        self.rejected.inc(1, {"model_name": model, "status": str(status)})
        self.prom.rejected.labels(model, str(status)).inc()


class RouterMetrics:
    """Router decisions and the engine replicas it sees; the same as ``meshserve:*`` series of
    the ingress's ``GET /metrics`` (``prom``, through ``RouterDeployment.metrics_snapshot``)."""

    def __init__(self) -> None:
        self.prom = RouterPrometheus()
        self.decisions = Counter(
            "meshserve_router_decisions", "Routing decisions by pool and reason.", ("pool", "reason")
        )
        self.known_replicas = Gauge("meshserve_router_known_replicas", "Engine replicas the router sees.", ("pool",))

    def decided(self, pool: str, reason: str) -> None:
        self.decisions.inc(1, {"pool": pool, "reason": reason})
        self.prom.decisions.labels(pool, reason).inc()

    def sees(self, pool: str, num_replicas: int) -> None:
        self.known_replicas.set(num_replicas, {"pool": pool})
        self.prom.known_replicas.labels(pool).set(num_replicas)
