"""bench/router_peers_servers.py: the workers' KV capacity is the spec's, read the way vLLM
publishes it, and nothing in the environment can override it."""

from __future__ import annotations

import prometheus_client

from bench.router_peers_metrics import decision_counts, engine_ttft_totals
from bench.router_peers_servers import ENGINE_ENV, EngineSpec, engine_env, worker_kv_blocks


def _metrics_text(num_gpu_blocks: int | None) -> str:
    """What a vLLM server's /metrics says about its cache: ``vllm:cache_config_info`` with the
    real ``CacheConfig.metrics_info()`` labels (as ``PrometheusStatLogger.log_metrics_info``)."""
    from vllm.config import CacheConfig

    config = CacheConfig(block_size=32, enable_prefix_caching=True)
    config.num_gpu_blocks = num_gpu_blocks
    info = {**config.metrics_info(), "engine": "0"}
    registry = prometheus_client.CollectorRegistry()
    gauge = prometheus_client.Gauge(
        "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labelnames=list(info), registry=registry
    )
    gauge.labels(**info).set(1)
    return prometheus_client.generate_latest(registry).decode()


def test_the_block_count_is_read_from_cache_config_info() -> None:
    assert worker_kv_blocks(_metrics_text(384)) == 384
    assert worker_kv_blocks(_metrics_text(16384)) == 16384


def test_no_cache_info_reads_as_unknown() -> None:
    assert worker_kv_blocks(_metrics_text(None)) is None
    assert worker_kv_blocks("vllm:num_requests_running 0.0\n") is None


def test_the_engines_never_see_vllm_cpu_kvcache_space() -> None:
    """vLLM-CPU lets VLLM_CPU_KVCACHE_SPACE replace --kv-cache-memory-bytes: a developer's shell
    that sets it must not turn the KV-pressure traces into roomy ones."""
    env = engine_env({"VLLM_CPU_KVCACHE_SPACE": "1", "PATH": "/bin"}, ENGINE_ENV)
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    assert env["PATH"] == "/bin"
    assert env["OMP_NUM_THREADS"] == "1"
    assert EngineSpec(model_path="m").kv_cache_memory_bytes == 384 * 32 * 2048


def test_engine_ttft_totals_sum_every_label_set_of_every_text() -> None:
    # The histogram as prometheus_client renders it (what vLLM's /metrics and ours serve).
    texts = []
    for engine, values in (("0", (0.1, 0.3)), ("1", (0.2,))):
        registry = prometheus_client.CollectorRegistry()
        ttft = prometheus_client.Histogram(
            "vllm:time_to_first_token_seconds", "TTFT", labelnames=["engine"], registry=registry
        )
        for v in values:
            ttft.labels(engine=engine).observe(v)
        texts.append(prometheus_client.generate_latest(registry).decode())
    total, count = engine_ttft_totals(texts)
    assert count == 3 and abs(total - 0.6) < 1e-9
    assert engine_ttft_totals(["# nothing here\n"]) == (0.0, 0.0)


def test_decision_counts_sum_each_reason_over_pools() -> None:
    """Our router's decisions as its own registry renders them (what our /metrics serves)."""
    from deployments.telemetry.router_prometheus import RouterPrometheus

    prom = RouterPrometheus()
    for pool, reason, n in (("vllm", "session", 3), ("vllm", "prefix", 2), ("tt", "session", 1)):
        prom.decisions.labels(pool, reason).inc(n)
    text = prometheus_client.generate_latest(prom.registry).decode()
    assert decision_counts(text) == {"session": 4.0, "prefix": 2.0}
    assert decision_counts("# nothing here\n") == {}
