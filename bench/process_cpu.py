"""CPU time per process of a benchmarked server (``bench/serve_overhead.py``,
``bench/profile_serving.py``): each process labelled by its role (Ray's proctitle or the
executable's), CPU seconds per label between two samples, as microseconds per streamed token.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from bench.serving_servers import Server


def process_label(cmdline: Sequence[str], name: str) -> str:
    """A readable name for one server process: Ray's proctitle (``ray::ServeReplica:...``)
    or the executable's role."""
    line = " ".join(cmdline)
    if "ServeReplica:" in line and ":Router" in line:  # ray::ServeReplica:<app>:Router, any app name
        return "router"
    for tag, label in (
        ("ProxyActor", "serve_proxy"),
        ("ServeController", "serve_controller"),
        ("OpenAIIngress", "ingress"),
        ("VllmReplica", "engine_replica"),
        ("TTMeshReplica", "engine_replica"),
        ("LLMServer", "llm_server_replica"),
        ("OpenAiIngress", "rayllm_ingress"),
        ("LLMRouter", "rayllm_ingress"),
        ("HAProxyManager", "haproxy_manager"),
        ("haproxy", "haproxy"),
        ("raylet", "raylet"),
        ("gcs_server", "gcs"),
        ("serving_servers.py", "driver"),
        ("router_peers.py", "driver"),
        ("api_server", "api_server"),
        ("vllm-router", "peer_router"),
        ("sglang-router", "peer_router"),
        ("sglang_router", "peer_router"),
        ("sglang::router", "peer_router"),
        ("vllm::router", "peer_router"),
    ):
        if tag in line:
            return label
    if "VLLM::Worker" in name or "VLLM::Worker" in line:
        return "vllm_worker"
    if "EngineCore" in name or "EngineCore" in line:
        return "vllm_engine_core"
    if "multiprocessing.spawn" in line:  # our TT engine-core process (accel.tt.engine_process)
        return "tt_engine_core"
    return "ray_other" if "ray" in line else name


class CpuSampler:
    """CPU seconds (user + system) per labelled process of one server between two samples."""

    def __init__(self, server: Server):
        self._server = server
        self._start: dict[int, tuple[str, float]] = {}

    def _read(self) -> dict[int, tuple[str, float]]:
        out = {}
        for p in self._server.cpu_processes():
            with contextlib.suppress(Exception):
                t = p.cpu_times()
                out[p.pid] = (process_label(p.cmdline(), p.name()), t.user + t.system)
        return out

    def start(self) -> None:
        self._start = self._read()

    def stop(self, num_tokens: int) -> dict[str, float]:
        per_label: dict[str, float] = {}
        for pid, (label, cpu_s) in self._read().items():
            used = cpu_s - self._start.get(pid, (label, 0.0))[1]
            per_label[label] = per_label.get(label, 0.0) + used
        return {k: round(1e6 * v / max(1, num_tokens), 1) for k, v in sorted(per_label.items()) if v > 0}


def machine_cpu_s() -> dict[int, tuple[str, float]]:
    """Every process of the machine: pid -> (label, CPU seconds so far)."""
    import psutil

    out = {}
    for p in psutil.process_iter():
        with contextlib.suppress(Exception):
            t = p.cpu_times()
            out[p.pid] = (process_label(p.cmdline(), p.name()), t.user + t.system)
    return out


def cpu_s_by_label(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds used between two ``machine_cpu_s`` samples, per label (the largest first)."""
    per_label: dict[str, float] = {}
    for pid, (label, cpu_s) in after.items():
        used = cpu_s - before.get(pid, (label, 0.0))[1]
        per_label[label] = per_label.get(label, 0.0) + used
    return {k: round(v, 1) for k, v in sorted(per_label.items(), key=lambda kv: -kv[1]) if v >= 0.05}
