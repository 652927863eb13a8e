"""``OrphanGuard``: the processes an owner started are stopped when the owner is SIGKILLed (what
``ray stop --force`` or Serve's forced replica kill does), and never a process that merely reuses
a pid. The last test does it with a real vLLM engine: its EngineCore and worker processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from accel.vllm.orphan_guard import ProcessId, stop_processes

ROOT = Path(__file__).resolve().parents[3]

OWNER = textwrap.dedent(
    """
    import json, subprocess, sys, time
    from accel.vllm.orphan_guard import OrphanGuard, descendant_pids, new_descendants

    before = descendant_pids()
    # A child with a grandchild, and a child that ignores SIGTERM.
    subprocess.Popen(["sh", "-c", "sleep 300 & wait"])
    subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
    time.sleep(0.5)
    guard = OrphanGuard(new_descendants(before))
    print(json.dumps({"pids": [p.pid for p in guard.processes], "watcher": guard.watcher_pid}), flush=True)
    if sys.argv[1] == "close":
        guard.close()
        print("closed", flush=True)
    time.sleep(300)
    """
)


def _start_owner(mode: str) -> tuple[subprocess.Popen[str], dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    owner = subprocess.Popen([sys.executable, "-c", OWNER, mode], stdout=subprocess.PIPE, text=True, env=env)
    assert owner.stdout is not None
    return owner, json.loads(owner.stdout.readline())


def _wait_gone(pids: list[int], timeout_s: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not left:
            return []
        time.sleep(0.2)
    return left


def test_owner_sigkilled_its_processes_are_stopped():
    owner, started = _start_owner("wait")
    try:
        assert len(started["pids"]) == 3  # sh, its sleep, the SIGTERM-ignoring python
        assert all(psutil.pid_exists(p) for p in started["pids"])
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        assert _wait_gone(started["pids"]) == []  # the SIGTERM-ignoring one too (SIGKILL after the grace)
        assert _wait_gone([started["watcher"]]) == []
    finally:
        owner.kill()
        stop_processes([ProcessId(p, psutil.Process(p).create_time()) for p in started["pids"] if psutil.pid_exists(p)])


def test_close_stops_what_is_left_and_the_watcher_exits():
    owner, started = _start_owner("close")
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "closed"
        assert _wait_gone(started["pids"] + [started["watcher"]], timeout_s=1.0) == []  # close() waited
        assert owner.poll() is None  # the owner itself lives on
    finally:
        owner.kill()


def test_a_reused_pid_is_never_signalled():
    child = subprocess.Popen(["sleep", "300"])
    try:
        real = ProcessId(child.pid, psutil.Process(child.pid).create_time())
        impostor = ProcessId(child.pid, real.create_time - 10.0)  # same pid, another process
        assert impostor.alive() is None and real.alive() is not None
        assert stop_processes([impostor], grace_s=0.5) == []
        assert child.poll() is None
        assert stop_processes([ProcessId.decode(real.encode())], grace_s=5.0) == [child.pid]
        child.wait(timeout=5)  # gone (stop_processes reaped it, so no exit status is left to read)
    finally:
        child.kill()


VLLM_OWNER = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from pathlib import Path

    async def main():
        from accel.vllm.config import VllmEngineConfig
        from accel.vllm.engine import VllmEngine

        config = VllmEngineConfig.from_engine_args({"model": sys.argv[1], "enforce_eager": True, "dtype": "float32",
            "max_model_len": 256, "max_num_seqs": 2, "block_size": 32}, xla_cache_root=Path(sys.argv[2]))
        engine = VllmEngine(config, use_ray_metrics=False)
        names = {}
        import psutil
        for p in engine._orphan_guard.processes:
            names[p.pid] = psutil.Process(p.pid).name()
        print("GUARDED", json.dumps(names), flush=True)
        await asyncio.sleep(600)

    if __name__ == "__main__":
        asyncio.run(main())
    """
)


@pytest.mark.slow
def test_a_killed_vllm_owner_leaves_no_engine_core_or_worker(tiny_llama, tmp_path):
    script = tmp_path / "owner.py"
    script.write_text(VLLM_OWNER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    owner = subprocess.Popen(
        [sys.executable, str(script), str(tiny_llama), str(tmp_path / "xla")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert owner.stdout is not None
        line = ""
        while not line.startswith("GUARDED "):  # vLLM logs to stdout too
            line = owner.stdout.readline()
            assert line, "the owner exited before its engine was up"
        names = {int(pid): name for pid, name in json.loads(line.removeprefix("GUARDED ")).items()}
        # vLLM names its processes (setproctitle): the engine core and its worker are the guarded ones.
        assert any("EngineCore" in n for n in names.values()) and any("Worker" in n for n in names.values()), names
        assert all(n.startswith("VLLM::") for n in names.values()), names  # not the resource tracker
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        assert _wait_gone(list(names)) == []
    finally:
        owner.kill()
        for proc in psutil.process_iter(["name"]):  # never leave a vLLM process behind a failed assert
            if proc.info["name"] and "VLLM::" in proc.info["name"] and proc.ppid() in (1, owner.pid):
                proc.kill()
