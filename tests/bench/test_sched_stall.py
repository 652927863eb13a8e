"""bench/sched_stall.py: the probe process reports its oversleep percentiles, in order."""

from __future__ import annotations

import time

import pytest

from bench.sched_stall import StallProbe


def test_probe_reports_ordered_oversleep_percentiles() -> None:
    probe = StallProbe(period_s=0.002)
    probe.start()
    time.sleep(0.3)
    out = probe.stop()
    assert out["samples"] > 0
    assert 0.0 <= out["p50_ms"] <= out["p99_ms"] <= out["max_ms"]


def test_stop_without_start_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="without start"):
        StallProbe().stop()
