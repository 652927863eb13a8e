"""Session fixtures: the tiny checkpoints, one Ray + Serve instance for the whole session, and slow
tests ordered after the fast ones."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def pytest_collection_modifyitems(config, items):
    # Fast unit tests first, then the slow end-to-end tests on the session's Ray, then the
    # simulated-cluster tests, which shut that Ray down for their own cluster (tests/e2e/cluster.py).
    # Stable within each group.
    def group(item) -> int:
        if item.get_closest_marker("cluster"):
            return 2
        return 1 if item.get_closest_marker("slow") else 0

    items.sort(key=group)


@pytest.fixture(scope="session")
def checkpoint_dir() -> Path:
    from accel.envs import ENVS
    from accel.models.tiny import ensure_checkpoints

    ensure_checkpoints(ENVS.checkpoint_dir)
    return ENVS.checkpoint_dir


@pytest.fixture(scope="session")
def smollm2(checkpoint_dir: Path) -> Path:
    """SmolLM2-135M-Instruct, the real default model (built by `make setup`; here if missing)."""
    from accel.models.smollm2 import ensure_checkpoint

    return ensure_checkpoint(checkpoint_dir)


@pytest.fixture(scope="session")
def tiny_lora_adapters(checkpoint_dir: Path) -> list[Path]:
    """Two seeded LoRA adapters of the tiny Llama (accel/models/tiny_lora.py)."""
    from accel.models.tiny_lora import ensure_adapters

    return ensure_adapters(checkpoint_dir)


@pytest.fixture(scope="session")
def tiny_llama(checkpoint_dir: Path) -> Path:
    return checkpoint_dir / "tiny-llama"


@pytest.fixture(scope="session")
def tiny_qwen3(checkpoint_dir: Path) -> Path:
    return checkpoint_dir / "tiny-qwen3"


@pytest.fixture(scope="session")
def tiny_qwen25_vl(checkpoint_dir: Path) -> Path:
    """The tiny Qwen2.5-VL (accel/models/tiny_vl.py)."""
    return checkpoint_dir / "tiny-qwen25-vl"


@pytest.fixture(scope="session")
def tiny_idefics3(checkpoint_dir: Path) -> Path:
    """The tiny Idefics3, the VLM vLLM-CPU pools serve (accel/models/tiny_idefics3.py)."""
    return checkpoint_dir / "tiny-idefics3"


@pytest.fixture(scope="module")
def loop():
    """One event loop per test module, for engines bound to the loop they were started in."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def free_port() -> int:
    """A TCP port free on this machine now (shared by the e2e and cluster fixtures)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def serve_session():
    """Yields the HTTP base URL of a fresh local Ray + Serve (never an existing cluster)."""
    import ray
    from ray import serve

    # Workers inherit the raylet's environment: make `tests.*` (test doubles) importable there.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    port = free_port()
    ray.init(
        address="local", num_cpus=2, object_store_memory=100 * 1024 * 1024, include_dashboard=False, log_to_driver=False
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield f"http://127.0.0.1:{port}"
    finally:
        if ray.is_initialized():  # (a cluster test may have shut it down already: tests/e2e/cluster.py)
            try:
                serve.shutdown()
            finally:
                ray.shutdown()
