"""Session fixtures: the tiny checkpoints, and slow tests ordered after the fast ones."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def pytest_collection_modifyitems(config, items):
    # Fast unit tests first, then the few slow end-to-end tests (stable within each group).
    items.sort(key=lambda item: 1 if item.get_closest_marker("slow") else 0)


@pytest.fixture(scope="session")
def checkpoint_dir() -> Path:
    from accel.envs import ENVS
    from accel.models.tiny import ensure_checkpoints

    ensure_checkpoints(ENVS.checkpoint_dir)
    return ENVS.checkpoint_dir


@pytest.fixture(scope="session")
def tiny_llama(checkpoint_dir: Path) -> Path:
    return checkpoint_dir / "tiny-llama"


@pytest.fixture(scope="session")
def tiny_qwen3(checkpoint_dir: Path) -> Path:
    return checkpoint_dir / "tiny-qwen3"


@pytest.fixture(scope="module")
def loop():
    """One event loop per test module, for engines bound to the loop they were started in."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()
