"""bench/sched_stall.py: the probe process reports its oversleep percentiles, in order."""

from __future__ import annotations

import os
import signal
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


def test_a_process_kept_off_the_cpu_shows_as_a_stall() -> None:
    """Freezing the probe (as a starved scheduler would) must show up in its max: a probe
    that reported fixed figures would not see it."""
    probe = StallProbe(period_s=0.002)
    probe.start()
    assert probe.pid is not None
    time.sleep(0.1)
    os.kill(probe.pid, signal.SIGSTOP)
    time.sleep(0.3)
    os.kill(probe.pid, signal.SIGCONT)
    time.sleep(0.1)
    out = probe.stop()
    assert out["max_ms"] >= 250.0
    assert out["p50_ms"] < out["max_ms"]
