"""The servers ``bench/serve_overhead.py`` compares, each in its own process group.

- ``bare``: vLLM's own OpenAI server, ``python -m vllm.entrypoints.openai.api_server``, with the
  engine args of the config's vLLM pool.
- ``rayllm``: Ray Serve LLM 2.60 (``ray.serve.llm.build_openai_app``) around the same engine
  (needs the ``bench`` extra: pyarrow).
- ``ours``: our application (``serve_app.app:build_app`` with the config's ``args``).

The two Ray servers run ``python bench/serving_servers.py <kind> ...`` as a child: a fresh local
Ray of their own (``address="local"``, small object store), Serve on the given port, until
SIGTERM, then ``serve.shutdown()`` + ``ray.shutdown()``. Stopping a server sends SIGTERM to its
process group and, after a grace period, SIGKILL to every process of that group or below the
child that is still alive (Ray's raylet, workers and vLLM engine cores included), so a run leaves
nothing behind even when a server hangs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script too (the Ray Serve LLM server process)

from accel.vllm.config import VllmEngineConfig  # noqa: E402
from bench.process_group import popen_group_kwargs  # noqa: E402
from deployments.config.load import load_app_config  # noqa: E402

SERVED_MODEL = "tiny-llama"  # the tiny configs' model name (what older callers assume)
STOP_GRACE_S = 45.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config_args(config: Path) -> dict[str, Any]:
    """The ``args`` of the config's first application (what ``build_app`` receives)."""
    return yaml.safe_load(config.read_text())["applications"][0]["args"]


def served_model_name(config: Path, engine: str = "vllm") -> str:
    """The name the config serves its first ``engine`` pool's model under: every server of a run
    (bare vLLM, Ray Serve LLM, ours) serves the model under that name."""
    pool = next((p for p in load_app_config(config_args(config)).pools if p.engine == engine), None)
    if pool is None:
        raise SystemExit(f"{config}: no {engine} pool")
    return pool.model


def vllm_engine_args(config: Path) -> dict[str, Any]:
    """Engine args of the config's first vLLM pool, as our replica hands them to vLLM."""
    pools = [p for p in load_app_config(config_args(config)).pools if p.engine == "vllm"]
    if not pools:
        raise SystemExit(f"{config}: no vLLM pool to compare with")
    engine = pools[0].engine_config
    assert isinstance(engine, VllmEngineConfig)
    return {
        f.name: getattr(engine, f.name)
        for f in dataclasses.fields(engine)
        if f.compare and getattr(engine, f.name) is not None
    }


@dataclasses.dataclass
class Server:
    """A started server: its name, base URL, the process and its log."""

    name: str
    url: str
    proc: subprocess.Popen
    log_path: Path

    def cpu_processes(self) -> list[psutil.Process]:
        """The server's processes now (the child and every descendant)."""
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []


def _wait_ready(url: str, proc: subprocess.Popen, log_path: Path, timeout_s: float, model: str) -> None:
    """Until the server completes a one-token request for ``model`` (routes in place and the
    engine up: ``/v1/models`` alone can answer before the engine replica has started)."""
    deadline = time.monotonic() + timeout_s
    body = {"model": model, "prompt": "ready?", "max_tokens": 1}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"server exited with {proc.returncode}; log {log_path}:\n{tail}")
        try:
            resp = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
            if resp.status_code == 200 and "choices" in resp.text:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} not ready after {timeout_s} s (log {log_path})")


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group; SIGKILL whatever of it (or below it) survives the grace."""
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    _gone, alive = psutil.wait_procs(family, timeout=5)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def stop_servers_on_sigterm() -> None:
    """Make SIGTERM unwind like Ctrl-C, so every ``started`` server's ``finally`` stops its process
    group: by default SIGTERM ends Python without running ``finally`` blocks, leaving the servers
    (and their Ray clusters) running behind a killed benchmark."""

    def _raise(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _raise)


@contextlib.contextmanager
def started(
    name: str,
    cmd: list[str],
    env: Mapping[str, str],
    port: int,
    log_dir: Path,
    timeout_s: float = 600,
    new_session: bool = False,
    model: str = SERVED_MODEL,
) -> Iterator[Server]:
    """The server running (ready to answer a completion for ``model``) in its own process group,
    in this session unless ``new_session`` (``bench/process_group.py`` says why)."""
    log_path = log_dir / f"{name}.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(env), cwd=REPO, **popen_group_kwargs(new_session)
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, log_path, timeout_s, model)
        yield Server(name, url, proc, log_path)
    finally:
        _stop(proc)
        log.close()


def bare_vllm_command(engine_args: Mapping[str, Any], port: int, served_model: str = SERVED_MODEL) -> list[str]:
    """vLLM's OpenAI server with the same engine args our replica passes to ``AsyncLLM``."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", engine_args["model"]]
    cmd += ["--served-model-name", served_model, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--max-model-len", str(engine_args["max_model_len"]), "--max-num-seqs", str(engine_args["max_num_seqs"])]
    cmd += ["--dtype", str(engine_args["dtype"]), "--disable-uvicorn-access-log"]
    if engine_args.get("block_size"):
        cmd += ["--block-size", str(engine_args["block_size"])]
    if engine_args.get("enforce_eager"):
        cmd.append("--enforce-eager")
    if engine_args.get("enable_prefix_caching"):
        cmd.append("--enable-prefix-caching")
    return cmd


# -- the environment the servers run in ----------------------------------------------------


def server_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for one Ray server: HAProxy's stats and metrics ports (fixed by default) of its own,
    so two HAProxy-mode servers can run side by side."""
    out = dict(env)
    if out.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
        out.setdefault("RAY_SERVE_HAPROXY_STATS_PORT", str(free_port()))
        out.setdefault("RAY_SERVE_HAPROXY_METRICS_PORT", str(free_port()))
    return out


def haproxy_threads(cpus: int | None = None) -> int:
    """HAProxy's threads for a host of ``cpus`` cores, as the Makefile computes them: a quarter of
    the cores, 1 to 4 (Ray's fixed default is 4; on 2 cores its threads cost ~40 % more CPU per
    streamed token than one thread: docs/BENCHMARKS.md at dbf54f6)."""
    if cpus is None:  # the cores this process may run on, as `nproc` counts them
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cpus // 4))


# Ray's own settings as `make serve` exports them (tests/bench/test_serving_servers.py checks the
# Makefile against this): Ray workers at nice 0 like the bare server, Serve's throughput mode,
# HAProxy in front of the ingress replicas' own HTTP servers (direct ingress) instead of Serve's
# Python proxy, with threads for the host's cores, the controller's loop at 0.5 s instead of 0.1 s
# (its and the GCS's idle CPU), a stopping ingress replica reachable 3 s instead of 30 before it
# refuses (shutdown only).
MAKE_SERVE_ENV = {
    "RAY_worker_niceness": "0",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    "RAY_SERVE_HAPROXY_NBTHREAD": str(haproxy_threads()),
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "3",
}


def direct_port_env(port: int) -> dict[str, str]:
    """Ray settings that give the first ingress replica of a Serve app ``port`` as its own HTTP
    port (Serve allocates direct-ingress ports from ``[MIN, MAX)``; the default range starts at
    30000). The replica serves the whole app there, the front (HAProxy) stays on the app's port."""
    return {
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + 1),
    }


# What --ray-env turns on; ``rayllm_default`` runs without them.
RAY_TUNING_VARS = tuple(MAKE_SERVE_ENV)
# --ray-env throughput: the first two only (Serve's Python proxy, Serve's default loop).
THROUGHPUT_VARS = ("RAY_worker_niceness", "RAY_SERVE_THROUGHPUT_OPTIMIZED")


def default_ray_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the Ray tuning: Ray Serve LLM as its quickstart runs it (the issue's 0.52x row)."""
    return {k: v for k, v in env.items() if k not in RAY_TUNING_VARS}


def base_env(opts) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Both Ray servers get the same settings (Ray starts workers at nice 15 while the bare server
    # runs at 0: same priority for all, or a busy machine measures niceness).
    names = {"throughput": THROUGHPUT_VARS, "haproxy": RAY_TUNING_VARS}.get(opts.ray_env, ())
    for name in names:
        env.setdefault(name, MAKE_SERVE_ENV[name])
    return env


def serve_command(kind: str, config: Path, port: int) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), kind, "--config", str(config), "--port", str(port)]


# -- inside the server child ------------------------------------------------------------------


def _rayllm_app(config: Path):
    from ray.serve.llm import LLMConfig, build_openai_app

    engine_args = vllm_engine_args(config)
    model_path = engine_args.pop("model")
    engine_kwargs = {k: v for k, v in engine_args.items() if k not in ("tokenizer", "served_model_name")}
    llm_config = LLMConfig(
        model_loading_config={"model_id": served_model_name(config), "model_source": model_path},
        accelerator_config={"kind": "cpu"},
        engine_kwargs=engine_kwargs,
        deployment_config={"num_replicas": 1},
    )
    return build_openai_app({"llm_configs": [llm_config]})


def _our_app(config: Path, placement: str | None = None):
    """Our app of ``config``; ``placement`` overrides every pool's (``own``: each pool in its own
    deployment, the path before ``placement: ingress`` existed)."""
    from serve_app.app import build_app

    args = config_args(config)
    if placement is not None:
        args["pools"] = [{**pool, "placement": placement} for pool in args["pools"]]
    return build_app(args)


def serve_until_terminated(kind: str, config: Path, port: int) -> None:
    """Run one Ray Serve server (``rayllm``, ``ours``, or ``ours_own``: ours with every pool in its
    own deployment) on a fresh local Ray until SIGTERM."""
    import ray
    from ray import serve

    # Logical CPUs: Ray Serve LLM's engine bundle and replicas ask for 1 CPU each; ours ask for 0.
    ray.init(
        address="local",
        num_cpus=8,
        object_store_memory=200 * 1024 * 1024,
        include_dashboard=False,
        log_to_driver=False,
    )
    # After ray.init, which installs a SIGTERM handler of its own that ends the process at once.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        if kind == "rayllm":
            app = _rayllm_app(config)
        else:
            app = _our_app(config, placement="own" if kind == "ours_own" else None)
        serve.run(app, name=kind, route_prefix="/")
        print(json.dumps({"serving": kind, "port": port}), flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description="one Ray Serve server of the serve_overhead bench")
    parser.add_argument("kind", choices=("rayllm", "ours", "ours_own"))
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    opts = parser.parse_args()
    sys.path.insert(0, str(REPO))
    serve_until_terminated(opts.kind, opts.config, opts.port)


if __name__ == "__main__":
    main()
