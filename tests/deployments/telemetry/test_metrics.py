"""Engine metrics: cumulative engine counters become increments, extras map to our series;
the shipped Grafana dashboard only queries series that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

from accel.contract import EngineStats, FinishReason, TTEngineStats
from deployments.telemetry import metrics as metrics_mod
from deployments.telemetry.metrics import EngineMetrics


class Recorder:
    def __init__(self):
        self.calls = []

    def inc(self, value=1, tags=None):
        self.calls.append(("inc", value, dict(tags or {})))

    def set(self, value, tags=None):
        self.calls.append(("set", value, dict(tags or {})))

    def observe(self, value, tags=None):
        self.calls.append(("observe", value, dict(tags or {})))


def _recording(m: EngineMetrics) -> EngineMetrics:
    for name in (
        "ttft",
        "itl",
        "tpot",
        "e2e",
        "running",
        "waiting",
        "kv_usage",
        "prompt_tokens",
        "generation_tokens",
        "prefix_queries",
        "prefix_hits",
        "success",
        "step_mode",
        "sampling",
        "lane_occupancy",
        "async_overlap",
    ):
        setattr(m, name, Recorder())
    return m


def test_cumulative_counters_become_increments():
    m = _recording(EngineMetrics("tiny", "tt", "r1"))
    m.observe_stats(
        EngineStats(1, 2, 10, 5, prefix_cache_queries=100, prefix_cache_hits=40),
        TTEngineStats(
            num_prefill_steps=2,
            num_decode_steps=5,
            num_device_sampled_tokens=7,
            lane_occupancy=(0.25, 0.5),
            async_overlap_fraction=0.9,
        ),
    )
    m.observe_stats(
        EngineStats(0, 1, 10, 8, prefix_cache_queries=130, prefix_cache_hits=40),
        TTEngineStats(num_prefill_steps=2, num_decode_steps=9, num_device_sampled_tokens=7, lane_occupancy=(0.0, 1.0)),
    )
    assert [c[1] for c in m.prefix_queries.calls] == [100, 30]
    assert [c[1] for c in m.prefix_hits.calls] == [40]
    assert [(c[1], c[2]["mode"]) for c in m.step_mode.calls] == [(2, "prefill"), (5, "decode"), (4, "decode")]
    assert [(c[1], c[2]["where"]) for c in m.sampling.calls] == [(7, "device")]
    assert [(c[1], c[2]["lane"]) for c in m.lane_occupancy.calls] == [(0.25, "0"), (0.5, "1"), (0.0, "0"), (1.0, "1")]
    assert [c[1] for c in m.async_overlap.calls] == [0.9, 0.0]
    assert abs(m.kv_usage.calls[-1][1] - 0.2) < 1e-9
    assert m.running.calls[-1][2] == {"model_name": "tiny", "pool": "tt", "replica": "r1"}


def test_finish_records_latency_tokens_and_reason():
    m = _recording(EngineMetrics("tiny", "tt", "r1"))
    m.observe_finish(FinishReason.STOP, 7, 5, 1.0, 0.2)
    assert m.tpot.calls[0][1] == 0.2  # (1.0 - 0.2) / (5 - 1)
    assert m.success.calls[0][2]["finished_reason"] == "stop"
    assert (m.prompt_tokens.calls[0][1], m.generation_tokens.calls[0][1]) == (7, 5)


def test_engine_that_emits_vllm_metrics_itself_is_not_doubled():
    m = _recording(EngineMetrics("tiny", "vllm", "r1", emit_vllm_metrics=False))
    m.observe_first_token(0.1)
    m.observe_finish(FinishReason.LENGTH, 3, 3, 1.0, 0.1)
    m.observe_stats(EngineStats(0, 1, 10, 5), TTEngineStats(num_decode_steps=1))
    assert not m.ttft.calls and not m.success.calls and not m.running.calls
    assert m.step_mode.calls  # ours still flow


def test_dashboard_queries_only_known_series():
    source = Path(metrics_mod.__file__).read_text()
    ours = set(re.findall(r'"(meshserve_[a-z0-9_]+)"', source)) | set(re.findall(r'"(vllm_[a-z0-9_]+)"', source))
    dash = json.loads((Path(__file__).parents[3] / "docs/grafana/meshserve.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {
        re.sub(r"_(total|bucket|sum|count)$", "", name)
        for e in exprs
        for name in re.findall(r"ray_((?:vllm|meshserve)_[a-z0-9_]+)", e)
    }
    assert used and used <= ours, used - ours
