"""The vllm:* series a replica keeps for an engine without vLLM's own logger (the TT engine):
vLLM's names, label names and buckets; observations become vLLM's counts."""

from __future__ import annotations

import math

import pytest

from accel.contract import EngineStats, FinishReason, TTEngineStats
from deployments.telemetry.engine_prometheus import EnginePrometheus, request_tokens_buckets
from deployments.telemetry.snapshot import MetricsSnapshot


def _values(snap: MetricsSnapshot, name: str) -> dict[tuple, float]:
    family = snap.family(name)
    assert family is not None, name
    return {tuple(v for k, v in s.labels if k not in ("model_name", "engine")): s.value for s in family.series}


def test_every_series_exists_at_zero_before_any_request_with_vllms_labels():
    snap = EnginePrometheus("tiny", 512).snapshot()
    vllm_names = {f.name for f in snap.families if f.name.startswith("vllm:")}
    assert {"vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:prompt_tokens"} <= vllm_names
    assert {"vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"} <= vllm_names
    for family in snap.families:
        assert family.series or family.name.startswith("meshserve:"), family.name  # (TT step stats come later)
        for series in family.series:
            assert (series.label("model_name"), series.label("engine")) == ("tiny", "0")
    assert _values(snap, "vllm:request_success") == {("stop",): 0.0, ("length",): 0.0, ("abort",): 0.0}
    assert _values(snap, "vllm:engine_sleep_state") == {
        ("awake",): 1.0,
        ("weights_offloaded",): 0.0,
        ("discard_all",): 0.0,
    }


def test_requests_and_stats_become_vllms_counts():
    prom = EnginePrometheus("tiny", 512)
    prom.observe_first_token(0.02)
    prom.observe_delta(0.3, 3)  # three tokens after 0.3 s: three inter-token gaps of 0.1 s
    prom.observe_finish(FinishReason.LENGTH, 7, 4, 0.5, 0.02, num_cached=4, max_tokens=4)
    prom.observe_finish(FinishReason.STOP, 3, 1, 0.1, 0.1)
    prom.observe_stats(EngineStats(1, 2, 10, 4, prefix_cache_queries=64, prefix_cache_hits=32))
    prom.observe_stats(EngineStats(0, 2, 10, 4, prefix_cache_queries=96, prefix_cache_hits=32), TTEngineStats(3, 9))
    snap = prom.snapshot()
    assert _values(snap, "vllm:prompt_tokens") == {(): 10.0}
    assert _values(snap, "vllm:generation_tokens") == {(): 5.0}
    assert _values(snap, "vllm:prompt_tokens_cached") == {(): 4.0}
    (computed,) = snap.family("vllm:request_prefill_kv_computed_tokens").series
    assert computed.value == 6.0 and computed.count == 2  # (7 - 4) + (3 - 0)
    (max_tokens,) = snap.family("vllm:request_params_max_tokens").series
    assert max_tokens.value == 4.0 and max_tokens.count == 1  # observed when set
    assert _values(snap, "vllm:request_success") == {("stop",): 1.0, ("length",): 1.0, ("abort",): 0.0}
    assert _values(snap, "vllm:prefix_cache_queries") == {(): 96.0}
    assert _values(snap, "vllm:prefix_cache_hits") == {(): 32.0}
    assert _values(snap, "vllm:num_requests_running") == {(): 2.0}
    assert _values(snap, "vllm:num_requests_waiting_by_reason") == {("capacity",): 0.0, ("deferred",): 0.0}
    assert _values(snap, "vllm:kv_cache_usage_perc") == {(): pytest.approx(0.6)}
    assert _values(snap, "meshserve:engine_steps") == {("prefill",): 3.0, ("decode",): 9.0}
    (itl,) = snap.family("vllm:inter_token_latency_seconds").series
    assert itl.count == 3 and itl.value == pytest.approx(0.3)
    (tpot,) = snap.family("vllm:request_time_per_output_token_seconds").series
    assert tpot.count == 2 and tpot.value == pytest.approx(0.16)  # (0.5 - 0.02) / 3, and 0 for one token
    (prompt_len,) = snap.family("vllm:request_prompt_tokens").series
    assert dict(prompt_len.buckets)[5.0] == 1 and dict(prompt_len.buckets)[10.0] == 2


def test_buckets_are_vllms():
    buckets = pytest.importorskip("vllm.v1.metrics.buckets")
    assert request_tokens_buckets(512) == tuple(buckets.build_1_2_5_buckets(512))
    snap = EnginePrometheus("tiny", 512).snapshot()
    for name, family in (
        ("vllm:time_to_first_token_seconds", "time_to_first_token"),
        ("vllm:inter_token_latency_seconds", "inter_token_latency"),
        ("vllm:request_time_per_output_token_seconds", "inter_token_latency"),
        ("vllm:e2e_request_latency_seconds", "request_latency"),
        ("vllm:request_decode_time_seconds", "request_latency"),
    ):
        (series,) = snap.family(name).series
        assert tuple(b for b, _ in series.buckets) == (*buckets.histogram_buckets(family), math.inf), name


def test_names_types_and_labels_are_those_of_vllms_prometheus_logger(tiny_llama):
    """Every vllm: family kept for the TT engine is one vLLM's PrometheusStatLogger registers for
    the same model, of the same type, with the same label names."""
    pytest.importorskip("vllm")
    from prometheus_client import REGISTRY
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.prometheus import unregister_vllm_metrics

    args = AsyncEngineArgs(model=str(tiny_llama), served_model_name=["tiny"], max_model_len=512, enforce_eager=True)
    PrometheusStatLogger(args.create_engine_config(UsageContext.ENGINE_CONTEXT), [0])
    try:
        theirs = {m.name: (m.type, {k for s in m.samples for k in s.labels} - {"le"}) for m in REGISTRY.collect()}
    finally:
        unregister_vllm_metrics()
    ours = EnginePrometheus("tiny", 512).snapshot()
    for family in ours.families:
        if family.name.startswith("vllm:"):
            labels = {k for s in family.series for k, _ in s.labels}
            assert theirs.get(family.name) == (family.kind, labels), family.name
