"""`make serve` after a crash: a `serve run` killed with SIGKILL leaves Ray's HAProxy on the
config's port; the pre-flight stops it and the next `serve run` comes up.

Runs `serve run` as `make serve` does (HAProxy, throughput mode) on configs/tiny.yaml moved to
free ports, with its own local Ray (``RAY_ADDRESS=local``): never a cluster someone else runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from serve_app.launch.port_holder import HolderKind, classify, haproxy_node_id
from serve_app.launch.process_table import listeners, process_table
from tests.conftest import REPO_ROOT, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

START_TIMEOUT_S = 360  # a tiny app on 2 busy cores; it is usually up in about a minute


def _env(stats_port: int, metrics_port: int) -> dict[str, str]:
    return {
        **os.environ,
        "RAY_ADDRESS": "local",
        "RAY_USAGE_STATS_ENABLED": "0",
        "HF_HUB_OFFLINE": "1",
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_HAPROXY_NBTHREAD": "1",
        "RAY_SERVE_HAPROXY_STATS_PORT": str(stats_port),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(metrics_port),
        "RAY_worker_niceness": "0",
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "3",
    }


def _serve_run(config: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    serve = Path(sys.executable).parent / "serve"
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(serve), "run", str(config)],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"serve run exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise AssertionError(f"not healthy in {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def _session_processes(sid: int) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.getsid(int(pid)) == sid:
                    out.append(int(pid))
            except OSError:
                pass
    return out


def _kill_session(sid: int, keep: frozenset[int] = frozenset()) -> None:
    for pid in _session_processes(sid):
        if pid in keep:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str], int]]:
    doc = yaml.safe_load((REPO_ROOT / "configs" / "tiny.yaml").read_text())
    port = free_port()
    doc["http_options"]["port"] = port
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(doc))
    yield config, _env(free_port(), free_port()), port


def test_a_killed_serve_run_leaves_haproxy_on_the_port_and_the_preflight_frees_it(app, tmp_path: Path):
    config, env, port = app
    url = f"http://127.0.0.1:{port}"
    first = _serve_run(config, env, tmp_path / "first.log")
    second: subprocess.Popen[bytes] | None = None
    try:
        _wait_healthy(url, first, tmp_path / "first.log")
        # A crash: SIGKILL to serve run and to every process of its Ray session at once (as the OOM
        # killer or a killed container cgroup would), except the HAProxy Ray leaves behind. After
        # a SIGKILL to serve run alone the HAProxy stayed once by hand and went with its session in
        # another run; killing the session at once leaves it every time.
        table = process_table()
        _kill_session(
            first.pid,
            keep=frozenset(p for p in _session_processes(first.pid) if p in table and haproxy_node_id(table[p])),
        )
        first.wait()
        deadline = time.monotonic() + 60
        while True:
            table = process_table()
            holders = [table[pid] for pid in listeners(port) if pid in table]
            kinds = {classify(h, table) for h in holders}
            if kinds == {HolderKind.DEAD_SESSION_HAPROXY} or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert kinds == {HolderKind.DEAD_SESSION_HAPROXY}, holders
        assert all(haproxy_node_id(h) is not None for h in holders)

        preflight = subprocess.run(
            [sys.executable, "-m", "serve_app.launch.preflight", str(config)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert preflight.returncode == 0, preflight.stderr
        assert f"stopped a dead Ray session's HAProxy (pid {holders[0].pid}" in preflight.stdout
        assert listeners(port) == set()

        second = _serve_run(config, env, tmp_path / "second.log")
        _wait_healthy(url, second, tmp_path / "second.log")
        # Now a live session holds the port: the pre-flight refuses in one line and touches nothing.
        live = subprocess.run(
            [sys.executable, "-m", "serve_app.launch.preflight", str(config)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert live.returncode == 1
        assert live.stderr.count("\n") == 1 and f"port {port}" in live.stderr and "a live Ray session" in live.stderr
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    finally:
        # Everything this test started, HAProxy included, runs in the two serve runs' sessions
        # (setsid: a session's id is its serve run's pid), and nothing else does.
        for proc in (first, second):
            if proc is not None:
                _kill_session(proc.pid)
