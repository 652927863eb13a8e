"""Merging replica snapshots: counters and histograms add, fractions average, info and state
gauges keep their largest value; buckets with other bounds merge over the union of bounds."""

from __future__ import annotations

import math

from deployments.telemetry.merge import gauge_rule, merge_snapshots
from deployments.telemetry.snapshot import Family, MetricsSnapshot, Series, labels_of

LABELS = labels_of({"model_name": "m", "engine": "0"})


def _snap(*families: Family) -> MetricsSnapshot:
    return MetricsSnapshot(families)


def test_counters_add_per_label_set():
    a = _snap(Family("vllm:request_success", "counter", "d", (Series(labels_of({"finished_reason": "stop"}), 2.0),)))
    b = _snap(
        Family(
            "vllm:request_success",
            "counter",
            "d",
            (
                Series(labels_of({"finished_reason": "stop"}), 3.0),
                Series(labels_of({"finished_reason": "length"}), 1.0),
            ),
        )
    )
    family = merge_snapshots([a, b]).family("vllm:request_success")
    assert family is not None and family.kind == "counter"
    assert {s.label("finished_reason"): s.value for s in family.series} == {"stop": 5.0, "length": 1.0}


def test_gauges_sum_but_fractions_average_and_states_keep_the_max():
    def gauges(running: float, usage: float, awake: float) -> MetricsSnapshot:
        return _snap(
            Family("vllm:num_requests_running", "gauge", "", (Series(LABELS, running),)),
            Family("vllm:kv_cache_usage_perc", "gauge", "", (Series(LABELS, usage),)),
            Family("vllm:engine_sleep_state", "gauge", "", (Series(LABELS, awake),)),
        )

    merged = merge_snapshots([gauges(2, 0.5, 1), gauges(3, 0.25, 1), gauges(0, 0.0, 1)])
    values = {f.name: f.series[0].value for f in merged.families}
    assert values == {
        "vllm:num_requests_running": 5.0,
        "vllm:kv_cache_usage_perc": 0.25,
        "vllm:engine_sleep_state": 1.0,
    }
    assert [gauge_rule(n) for n in ("vllm:cache_config_info", "meshserve:lane_occupancy")] == ["max", "sum"]


def test_histograms_with_equal_bounds_add_bucket_by_bucket():
    a = Series(LABELS, 1.5, ((0.1, 1.0), (1.0, 2.0), (math.inf, 3.0)))
    b = Series(LABELS, 0.5, ((0.1, 0.0), (1.0, 1.0), (math.inf, 1.0)))
    family = merge_snapshots(
        [_snap(Family("vllm:e2e_request_latency_seconds", "histogram", "", (s,))) for s in (a, b)]
    ).family("vllm:e2e_request_latency_seconds")
    assert family is not None
    (merged,) = family.series
    assert merged.value == 2.0 and merged.count == 4.0
    assert merged.buckets == ((0.1, 1.0), (1.0, 3.0), (math.inf, 4.0))


def test_histograms_with_other_bounds_merge_over_the_union_exactly_at_shared_bounds():
    a = Series(LABELS, 3.0, ((1.0, 1.0), (10.0, 2.0), (math.inf, 2.0)))
    b = Series(LABELS, 7.0, ((5.0, 1.0), (math.inf, 3.0)))
    (merged,) = (
        merge_snapshots([_snap(Family("vllm:request_prompt_tokens", "histogram", "", (s,))) for s in (a, b)])
        .families[0]
        .series
    )
    assert merged.buckets == ((1.0, 1.0), (5.0, 2.0), (10.0, 3.0), (math.inf, 5.0))
    assert merged.value == 10.0


def test_a_family_of_another_kind_elsewhere_keeps_the_first_kind():
    a = _snap(Family("x", "counter", "", (Series((), 1.0),)))
    b = _snap(Family("x", "gauge", "", (Series((), 7.0),)))
    merged = merge_snapshots([a, b])
    assert [(f.kind, f.series[0].value) for f in merged.families] == [("counter", 1.0)]


def test_nothing_to_merge_is_an_empty_snapshot():
    assert merge_snapshots([]) == MetricsSnapshot()


def test_created_is_the_earliest_replicas():
    def counter(created):
        return _snap(Family("vllm:prompt_tokens", "counter", "", (Series(LABELS, 1.0, created=created),)))

    def histogram(created):
        series = Series(LABELS, 1.0, ((math.inf, 1.0),), created)
        return _snap(Family("vllm:e2e_request_latency_seconds", "histogram", "", (series,)))

    merged = merge_snapshots([counter(20.0), counter(None), counter(10.0), histogram(30.0), histogram(5.0)])
    assert [f.series[0].created for f in merged.families] == [10.0, 5.0]
