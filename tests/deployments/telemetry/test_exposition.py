"""Snapshots read from a prometheus_client registry and written back in Prometheus' text format:
prometheus_client's own parser reads back the same values (counters with ``_total``, histograms'
``_bucket``/``_sum``/``_count``), labels a series lacks stay absent."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.parser import text_string_to_metric_families

from deployments.telemetry.exposition import render
from deployments.telemetry.snapshot import Family, MetricsSnapshot, Series, labels_of, registry_snapshot, with_label


def _parsed(body: bytes) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    c = Counter("vllm:prompt_tokens", "Prompt tokens.", ["model_name", "engine"], registry=registry)
    c.labels("served-path", "0").inc(7)
    g = Gauge("vllm:num_requests_running", "Running.", ["model_name", "engine"], registry=registry)
    g.labels("served-path", "0").set(2)
    h = Histogram(
        "vllm:e2e_request_latency_seconds", "E2E.", ["model_name", "engine"], buckets=(0.5, 1.0), registry=registry
    )
    h.labels("served-path", "0").observe(0.25)
    h.labels("served-path", "0").observe(0.75)
    Gauge("other:thing", "Not vLLM's.", registry=registry).set(1)
    return registry


def test_a_registry_snapshot_holds_its_prefix_families_typed_and_relabelled():
    snap = registry_snapshot(_registry(), "vllm:", with_label("model_name", "tiny"))
    assert [(f.name, f.kind) for f in snap.families] == [
        ("vllm:prompt_tokens", "counter"),
        ("vllm:num_requests_running", "gauge"),
        ("vllm:e2e_request_latency_seconds", "histogram"),
    ]
    (counter,) = snap.families[0].series
    assert counter.labels == labels_of({"model_name": "tiny", "engine": "0"}) and counter.value == 7.0
    (hist,) = snap.families[2].series
    assert hist.buckets == ((0.5, 1.0), (1.0, 2.0), (math.inf, 2.0)) and hist.value == 1.0 and hist.count == 2.0


def test_render_round_trips_through_prometheus_clients_parser():
    body = render(registry_snapshot(_registry(), "vllm:"))
    parsed = _parsed(body)
    key = (("engine", "0"), ("model_name", "served-path"))
    assert parsed["vllm:prompt_tokens_total"] == {key: 7.0}
    assert parsed["vllm:num_requests_running"] == {key: 2.0}
    assert parsed["vllm:e2e_request_latency_seconds_count"] == {key: 2.0}
    assert parsed["vllm:e2e_request_latency_seconds_sum"] == {key: 1.0}
    buckets = parsed["vllm:e2e_request_latency_seconds_bucket"]
    assert {dict(k)["le"]: v for k, v in buckets.items()} == {"0.5": 1.0, "1.0": 2.0, "+Inf": 2.0}
    assert b"# TYPE vllm:prompt_tokens_total counter" in body
    # _created as prometheus_client (and so vLLM) writes it, for counters and histograms alike
    assert set(parsed["vllm:prompt_tokens_created"]) == {key}
    assert set(parsed["vllm:e2e_request_latency_seconds_created"]) == {key}
    assert b"# TYPE vllm:e2e_request_latency_seconds histogram" in body


def test_series_with_other_label_names_share_one_family():
    """A label a series lacks is written empty, which Prometheus reads as absent."""
    family = Family(
        "vllm:cache_config_info",
        "gauge",
        "Info.",
        (Series(labels_of({"engine": "0", "block_size": "32"}), 1.0), Series(labels_of({"engine": "0"}), 1.0)),
    )
    parsed = _parsed(render(MetricsSnapshot((family,))))
    assert set(parsed["vllm:cache_config_info"]) == {
        (("block_size", "32"), ("engine", "0")),
        (("block_size", ""), ("engine", "0")),
    }


def test_an_empty_family_renders_its_help_and_type():
    """As prometheus_client writes a counter no series of which exists yet (vLLM's /metrics too)."""
    body = render(MetricsSnapshot((Family("vllm:request_success", "counter", "Finished.", ()),)))
    assert body == b"# HELP vllm:request_success_total Finished.\n# TYPE vllm:request_success_total counter\n"
