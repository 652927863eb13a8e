"""bench/serving_servers.py: the Ray servers run with exactly the settings `make serve` exports."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from bench.serving_servers import RAY_TUNING_VARS, base_env, default_ray_env

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"


def make_serve_exports() -> dict[str, str]:
    """``serve: export NAME := VALUE`` lines of the Makefile."""
    pattern = re.compile(r"^serve: export (\w+) := (\S+)$", re.MULTILINE)
    return dict(pattern.findall(MAKEFILE.read_text()))


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*RAY_TUNING_VARS, *make_serve_exports()):
        monkeypatch.delenv(name, raising=False)


def test_make_serve_exports_the_tuning(clean_env: None) -> None:
    exports = make_serve_exports()
    assert exports["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] == "0.5"
    assert sorted(exports) == sorted(RAY_TUNING_VARS)


def test_haproxy_bench_env_is_what_make_serve_exports(clean_env: None) -> None:
    env = base_env(argparse.Namespace(ray_env="haproxy"))
    assert {name: env.get(name) for name in make_serve_exports()} == make_serve_exports()


def test_throughput_env_keeps_the_proxy_and_the_default_control_loop(clean_env: None) -> None:
    env = base_env(argparse.Namespace(ray_env="throughput"))
    assert env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in env
    assert "RAY_SERVE_CONTROL_LOOP_INTERVAL_S" not in env


def test_ray_serve_llm_default_drops_every_tuning_var(clean_env: None) -> None:
    env = default_ray_env(base_env(argparse.Namespace(ray_env="haproxy")))
    assert not set(RAY_TUNING_VARS) & set(env)
    assert env["VLLM_TARGET_DEVICE"] == "cpu"  # the engine's own settings stay
