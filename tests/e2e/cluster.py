"""A simulated multi-node Ray cluster for one test module (``ray.cluster_utils.Cluster``: every
node a real raylet on this machine, with the resources and labels a real TPU/TT host has).

The session's own Ray + Serve (``tests/conftest.py::serve_session``) is one Ray instance per
process; a cluster test needs its own, so ``simulated_cluster`` first shuts the session's down
(Serve, then Ray). ``pytest_collection_modifyitems`` orders ``cluster`` tests after every other
test, so nothing needs the session's Ray after that (its teardown then finds Ray already down).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any

from tests.conftest import REPO_ROOT

SMALL_OBJECT_STORE = 80 * 1024 * 1024
NODE_START_TIMEOUT_S = 90.0  # Ray's 30 s is short for a raylet on a loaded 2-core machine


def leave_session_ray() -> None:
    """Shut down the session's Ray (and Serve on it), if this process has one."""
    import ray
    from ray import serve

    if ray.is_initialized():
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


@contextlib.contextmanager
def simulated_cluster(head: dict[str, Any], nodes: list[dict[str, Any]]) -> Iterator[tuple[Any, list[Any]]]:
    """A head node plus ``nodes`` (``Cluster.add_node`` kwargs), this process connected to it.
    Yields ``(cluster, [node handles])``; everything is shut down on exit."""
    import ray
    from ray import serve

    leave_session_ray()
    # Workers inherit the raylets' environment: make `tests.*` (test doubles) importable there.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    cluster = _start_head(head)
    try:
        handles = [_add_node(cluster, {"object_store_memory": SMALL_OBJECT_STORE, **n}) for n in nodes]
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes(timeout=NODE_START_TIMEOUT_S)
        try:
            yield cluster, handles
        finally:
            with contextlib.suppress(Exception):
                serve.shutdown()
            ray.shutdown()
    finally:
        cluster.shutdown()


def _start_head(head: dict[str, Any]) -> Any:
    """The head node, on free ports (other Ray instances on this machine hold the defaults:
    GCS 6379, dashboard agent 52365); one retry, since a raylet on an overloaded 2-core machine
    can miss its start-up deadline."""
    from ray.cluster_utils import Cluster

    for attempt in range(2):
        args = {
            "object_store_memory": SMALL_OBJECT_STORE,
            "include_dashboard": False,
            "gcs_server_port": _free_port(),
            "dashboard_agent_listen_port": _free_port(),
            **head,
        }
        try:
            return Cluster(initialize_head=True, head_node_args=args)
        except Exception:
            if attempt == 1:
                raise
    raise AssertionError("unreachable")


def _add_node(cluster: Any, args: dict[str, Any]) -> Any:
    """A worker node, waited for longer than Ray's default; one retry (its processes are removed
    first) when the raylet does not come up in time."""
    for attempt in range(2):
        node = None
        try:
            node = cluster.add_node(wait=False, **args)
            cluster._wait_for_node(node, timeout=NODE_START_TIMEOUT_S)
            return node
        except Exception:
            if node is not None:
                with contextlib.suppress(Exception):
                    cluster.remove_node(node, allow_graceful=False)
            if attempt == 1:
                raise
    raise AssertionError("unreachable")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
