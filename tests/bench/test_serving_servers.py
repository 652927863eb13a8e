"""bench/serving_servers.py: the Ray servers run with exactly the settings `make serve` exports."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bench.serving_servers import RAY_TUNING_VARS, base_env, default_ray_env, haproxy_threads

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"


def make_serve_exports(**make_vars: str) -> dict[str, str]:
    """``serve: export NAME := VALUE`` lines of the Makefile, values as make expands them
    (``make_vars`` set on make's command line)."""
    pattern = re.compile(r"^serve: export (\w+) := (\S+)$", re.MULTILINE)
    exports = dict(pattern.findall(MAKEFILE.read_text()))
    if not any("$" in v for v in exports.values()):
        return exports
    make = shutil.which("make")
    if make is None:
        pytest.skip("GNU make is not installed")
    # One make run that prints every value, the Makefile's own variables expanded.
    recipe = "".join(f"\t@echo '{name}={value}'\n" for name, value in exports.items())
    script = MAKEFILE.read_text() + f"\nprint-serve-exports:\n{recipe}"
    assignments = [f"{k}={v}" for k, v in make_vars.items()]
    out = subprocess.run(
        [make, "-s", "--no-print-directory", "-f", "-", *assignments, "print-serve-exports"],
        input=script,
        capture_output=True,
        text=True,
        check=True,
        cwd=MAKEFILE.parent,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


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


def test_haproxy_gets_a_quarter_of_the_cores_one_to_four() -> None:
    assert [haproxy_threads(n) for n in (1, 2, 4, 7, 8, 15, 16, 64)] == [1, 1, 1, 1, 2, 3, 4, 4]
    # The Makefile computes the same from `nproc`.
    assert make_serve_exports()["RAY_SERVE_HAPROXY_NBTHREAD"] == str(haproxy_threads())
    assert make_serve_exports(HAPROXY_THREADS="3")["RAY_SERVE_HAPROXY_NBTHREAD"] == "3"


def test_throughput_env_keeps_the_proxy_and_the_default_control_loop(clean_env: None) -> None:
    env = base_env(argparse.Namespace(ray_env="throughput"))
    assert env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in env
    assert "RAY_SERVE_CONTROL_LOOP_INTERVAL_S" not in env


def test_ray_serve_llm_default_drops_every_tuning_var(clean_env: None) -> None:
    env = default_ray_env(base_env(argparse.Namespace(ray_env="haproxy")))
    assert not set(RAY_TUNING_VARS) & set(env)
    assert env["VLLM_TARGET_DEVICE"] == "cpu"  # the engine's own settings stay
