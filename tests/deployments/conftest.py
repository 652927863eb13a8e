"""One Ray instance (and one Serve HTTP proxy) for the whole test session, started on first use
by a slow end-to-end test and always shut down. Small on purpose: 2 logical CPUs (every
deployment asks for 0), a 100 MB object store, no dashboard."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def serve_session():
    """Yields the HTTP base URL of a fresh local Ray + Serve (never an existing cluster)."""
    import ray
    from ray import serve

    # Workers inherit the raylet's environment: make `tests.*` (test doubles) importable there.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    port = _free_port()
    ray.init(address="local", num_cpus=2, object_store_memory=100 * 1024 * 1024,
             include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield f"http://127.0.0.1:{port}"
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
