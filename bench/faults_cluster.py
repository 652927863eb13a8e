"""The fault suite's view of the running app from the driver (``bench/faults.py``): the engine
replicas' routing snapshots, killing a Serve actor, waiting for a pool's replicas to come back,
the engines' load and KV use, the ingress process's RSS.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

APP = "faults"
POOLS = {"tt": "TTMeshReplica-tt", "vllm": "VllmReplica-vllm"}


async def snapshots(pool: str) -> list[Any]:
    from ray import serve

    handle = serve.get_deployment_handle(POOLS[pool], APP)
    return list(await handle.broadcast("routing_snapshot", {}).results_async(return_exceptions=True))


def kill_actor(name: str) -> None:
    import ray

    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)


def replica_actor_name(pool: str, replica_id: str) -> str:
    from ray.serve._private.common import DeploymentID, ReplicaID

    return ReplicaID(replica_id, DeploymentID(name=POOLS[pool], app_name=APP)).to_full_id_str()


async def live_replicas(pool: str) -> int:
    return sum(1 for s in await snapshots(pool) if not isinstance(s, BaseException))


async def wait_replicas(pool: str, n: int, timeout_s: float = 300) -> float:
    start = time.monotonic()
    while await live_replicas(pool) < n:
        if time.monotonic() - start > timeout_s:
            return float("nan")
        await asyncio.sleep(0.25)
    return time.monotonic() - start


async def engine_state(pool: str) -> list[dict[str, int]]:
    return [
        {
            "inflight": s.num_inflight,
            "running": s.stats.num_running,
            "waiting": s.stats.num_waiting,
            "kv_used_blocks": s.stats.num_kv_blocks_total - s.stats.num_kv_blocks_free,
        }
        for s in await snapshots(pool)
        if not isinstance(s, BaseException)
    ]


def ingress_rss() -> int:
    import ray

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if f"{APP}#OpenAIIngress#" in a["name"]]
    actor = ray.get_actor(names[0], namespace="serve")
    pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
    import psutil

    return int(psutil.Process(pid).memory_info().rss)
