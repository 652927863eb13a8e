"""bench/process_cpu.py: processes are labelled by role, and CPU seconds are split per label
between two samples of the whole machine."""

from __future__ import annotations

import os
import time

from bench.process_cpu import cpu_s_by_label, machine_cpu_s, process_label


def test_roles_are_read_from_ray_proctitles_and_router_binaries() -> None:
    assert process_label(["ray::ServeReplica:bench:OpenAIIngress"], "ray::ServeRepli") == "ingress"
    # Our router under any app name (router_peers runs the app as "bench", serve_overhead as "ours").
    for app in ("bench", "ours"):
        assert process_label([f"ray::ServeReplica:{app}:Router"], "ray::ServeRepli") == "router"
    assert process_label(["/venv/bin/vllm-router", "--policy", "cache_aware"], "vllm-router") == "peer_router"
    assert process_label(["python", "bench/router_peers.py", "--agentic"], "python") == "driver"
    assert process_label(["VLLM::Worker"], "VLLM::Worker") == "vllm_worker"


def test_cpu_seconds_are_split_per_label_between_two_samples() -> None:
    before = {1: ("ingress", 2.0), 2: ("vllm_worker", 10.0), 3: ("gone", 1.0)}
    after = {1: ("ingress", 3.5), 2: ("vllm_worker", 14.0), 4: ("ingress", 0.5), 5: ("idle", 0.01)}
    # A process born between the samples counts from zero; one that left is not counted.
    assert cpu_s_by_label(before, after) == {"vllm_worker": 4.0, "ingress": 2.0}
    # This very process shows up in a real sample of the machine, and its busy loop counts.
    first = machine_cpu_s()
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    second = machine_cpu_s()
    assert os.getpid() in first and second[os.getpid()][1] - first[os.getpid()][1] >= 0.15
