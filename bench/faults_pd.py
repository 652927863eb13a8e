"""The fault suite's prefill/decode scenario (``bench/faults.py --scenarios kv_actor_kill``, issue 15
item 3): the KV-connector actor's process is killed (SIGKILL) while PD streams run.

Its own app (``faults-pd``, deployed only for this scenario): tiny-llama on one TT-mesh prefill
replica and one vLLM-CPU decode replica, ``pd.threshold_tokens`` 64, every prompt longer. The
actor is made before the replicas with ``shm_max_payload_bytes=0`` (``--kv-path object``, the
default): every hand-off goes through it, the path a dead actor costs KV (``--kv-path shm``: the
node's shared-memory store, which survives the actor).

Counted: streams completed / failed / hung, token-exact against their uninterrupted run through
the same app (made first), recomputes the restarted actor was told of, time until the actor
answers again (Ray restarts it: ``max_restarts=-1``) and until a long prompt is disaggregated
through it again, and what is left afterwards (requests and KV blocks in the engines, transfers
in the actor once the leases of the lost ones expired).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import faults_clients as clients
import httpx

PD_APP = "faults-pd"
PD_POOLS = {"prefill": "TTMeshReplica-tt-prefill", "decode": "VllmReplica-vllm-decode"}
LEASE_S = 5.0


def pd_app_args(model_path: str, capacity: int) -> dict[str, Any]:
    common = {"accelerator": "cpu", "model": "tiny-llama", "replicas": 1, "resources": {"num_cpus": 0}}
    return {
        "config_file": "bench/faults_pd.py",
        "models": [{"name": "tiny-llama", "path": model_path}],
        "pools": [
            {
                **common,
                "name": "tt-prefill",
                "engine": "tt",
                "role": "prefill",
                "engine_args": {"max_model_len": 512, "data_parallel_size": 1, "max_num_seqs": 8, "block_size": 16},
            },
            {
                **common,
                "name": "vllm-decode",
                "engine": "vllm",
                "role": "decode",
                "engine_args": {
                    "max_model_len": 512,
                    "max_num_seqs": 8,
                    "dtype": "float32",
                    "enforce_eager": True,
                    "block_size": 32,
                    "enable_prefix_caching": True,
                },
            },
        ],
        "pd": {"threshold_tokens": 64},
        "router": {"stats_period_s": 0.5},
        "ingress": {"max_concurrent_requests": capacity},
    }


def make_actor(kv_path: str) -> None:
    """The app's KV-connector actor, before its replicas ask for one."""
    from deployments.kv.connector_actor import KVConnectorConfig, get_or_create_kv_connector

    extra = {"shm_max_payload_bytes": 0} if kv_path == "object" else {}
    get_or_create_kv_connector(PD_APP, KVConnectorConfig(lease_s=LEASE_S, **extra))


def remove_actor() -> None:
    from deployments.kv.connector_actor import kill_kv_connector

    kill_kv_connector(PD_APP)


def pd_prompts(n: int) -> list[list[int]]:
    """Distinct prompts of 70-133 tokens (past the PD threshold), inside the tiny vocabulary."""
    return [[1] + [3 + (i * 31 + j * 17) % 1000 for j in range(69 + i % 64)] for i in range(n)]


def _actor_stats() -> dict[str, Any]:
    from deployments.kv.connector_actor import get_kv_connector

    stats: dict[str, Any] = get_kv_connector(PD_APP).stats()["registry"]
    return stats


def _actor_pid() -> int:
    import ray

    from deployments.kv.connector_actor import get_kv_connector

    return int(ray.get(get_kv_connector(PD_APP).handle.__ray_call__.remote(lambda self: os.getpid()), timeout=5))


async def _engine_state(pool: str) -> list[dict[str, int]]:
    from ray import serve

    handle = serve.get_deployment_handle(PD_POOLS[pool], PD_APP)
    return [
        {
            "inflight": s.num_inflight,
            "running": s.stats.num_running,
            "waiting": s.stats.num_waiting,
            "kv_used_blocks": s.stats.num_kv_blocks_total - s.stats.num_kv_blocks_free,
        }
        for s in await handle.broadcast("routing_snapshot", {}).results_async(return_exceptions=True)
        if not isinstance(s, BaseException)
    ]


async def _until(check: Any, timeout_s: float) -> float:
    """Seconds until ``check()`` is true (exceptions count as false); NaN past ``timeout_s``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            if await asyncio.to_thread(check):
                return time.monotonic() - start
        except Exception:
            pass
        await asyncio.sleep(0.2)
    return float("nan")


async def kv_actor_kill(base: str, streams: int, max_tokens: int, hang_s: float) -> dict[str, Any]:
    url = f"{base}/v1/completions"
    prompts = pd_prompts(streams)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        refs = [await clients.reference(client, url, None, p, max_tokens) for p in prompts]
        completed_before = _actor_stats()["num_completed"]
        old_pid = _actor_pid()
        started = asyncio.Event()
        tasks = [
            asyncio.ensure_future(clients.stream(client, url, None, p, max_tokens, ev, hang_s))
            for p, ev in zip(prompts, [started] + [asyncio.Event() for _ in prompts[1:]])
        ]
        await asyncio.wait_for(started.wait(), 300)  # the first stream's hand-off is done
        os.kill(old_pid, signal.SIGKILL)
        kill_at = time.monotonic()
        actor_back_s = await _until(lambda: _actor_pid() != old_pid, 120)
        results = await asyncio.gather(*tasks)
        clients_done_s = time.monotonic() - kill_at
        # A long prompt disaggregated through the restarted actor again (its own counter).
        completed_after_restart = _actor_stats()["num_completed"]
        probe = [1] + [3 + (7 * j) % 1000 for j in range(90)]
        probe_status = (await client.post(url, json=clients.body(probe, 4, False))).status_code
        waited = await _until(lambda: _actor_stats()["num_completed"] > completed_after_restart, 30)
        pd_again_s = time.monotonic() - kill_at if waited == waited else float("nan")  # (NaN: never)
    settle_start = time.monotonic()
    state: dict[str, list[dict[str, int]]] = {}
    while time.monotonic() - settle_start < 30:
        state = {pool: await _engine_state(pool) for pool in PD_POOLS}
        if all(all(v == 0 for r in rs for v in r.values()) for rs in state.values()):
            break
        await asyncio.sleep(0.5)
    transfers_left_s = await _until(lambda: _actor_stats()["num_transfers"] == 0, 4 * LEASE_S)
    actor = _actor_stats()
    outcomes = [r["outcome"] for r in results]
    return {
        "streams": streams,
        "max_tokens": max_tokens,
        "completed_before_kill": completed_before,
        "completed": outcomes.count("completed"),
        "failed": outcomes.count("failed"),
        "hung": outcomes.count("hung"),
        "token_exact": sum(r["outcome"] == "completed" and r["tokens"] == ref for r, ref in zip(results, refs)),
        "recomputes_reported_to_restarted_actor": actor["recomputes"],
        "actor_back_after_kill_s": round(actor_back_s, 2),
        "all_streams_done_after_kill_s": round(clients_done_s, 2),
        "probe_status": probe_status,
        "pd_through_restarted_actor_after_kill_s": round(pd_again_s, 2),
        "engines_after": state,
        "leaked_kv_blocks": sum(r["kv_used_blocks"] for rs in state.values() for r in rs),
        "requests_left_in_flight": sum(
            r["inflight"] + r["running"] + r["waiting"] for rs in state.values() for r in rs
        ),
        "actor_transfers_after": {"num_transfers": actor["num_transfers"], "num_bytes_used": actor["num_bytes_used"]},
        "actor_transfers_freed_after_s": round(transfers_left_s, 1),
        "errors": sorted({str(r.get("error") or r.get("status")) for r in results if r["outcome"] != "completed"}),
    }
