"""The fault suite (issue 15): faults injected into a running app under load, measured from the
client's side. Prints ONE JSON object; run it alone:
``flock /tmp/meshserve-heavy.lock python bench/faults.py [--scenarios a,b]`` (default: all five below).

The app (one per run, on a fresh local Ray + Serve): tiny-llama on two TT-mesh replicas (torch
mesh model) and two vLLM-CPU replicas, ingress ``max_concurrent_requests`` = ``--capacity``.

Scenarios (each a number in the JSON, and a slow test in tests/e2e/):
- ``replica_kill`` (item 1): ``--streams`` greedy streams (half pinned to each pool, distinct
  prompts, ignore_eos, ``--max-tokens``); once every stream has sent tokens, one busy TT replica
  and one busy vLLM replica are killed. Counted: streams completed / failed / hung (no byte for
  ``--hang-s``), streams token-exact against their uninterrupted run (made first: the proof that each
  stream continued where it stopped), usage exact (original prompt once); recovery = kill -> the pool has its
  replicas again (Serve's replacement). tests/e2e/test_failover.py is the test.
- ``router_kill`` (item 2): the router replica is killed, then ``--streams`` requests are sent at
  once; the ingress decides locally while it is gone (``meshserve_router_fallbacks``). Counted:
  failed requests (want 0), time until the router answers again.
- ``disconnect_soak`` (item 4): ``--soak-requests`` streams (half per pool, ``--capacity`` at a
  time), 30 % of the clients leaving after 2-5 chunks; counted: outcomes, and afterwards every
  engine replica's requests in flight / running / waiting and KV blocks in use (want all 0: the
  prefix cache's unreferenced blocks count as free, as in vLLM).
- ``overload`` (item 5): ``10 x --capacity`` requests at once; counted: statuses (want only 200,
  429 and 503, every 429/503 with Retry-After), the ingress process's RSS before / peak / after,
  and whether a request succeeds right after (recovery).
- ``kv_actor_kill`` (item 3): the KV-connector actor killed under PD streams, on its own PD app
  (``bench/faults_pd.py``, deployed only when this scenario runs; tests/e2e/test_pd_faults.py).
Not here (see docs/BENCHMARKS.md, Reliability): item 7 (hung engine; tests/e2e/test_hung_replica.py);
item 6 (fuzz) is a test only (tests/e2e/test_ingress_edge.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import faults_clients as clients  # noqa: E402
import faults_cluster as cluster  # noqa: E402
import faults_pd  # noqa: E402
from faults_cluster import APP, POOLS  # noqa: E402
from serving_servers import free_port  # noqa: E402


def app_args(model_path: str, capacity: int) -> dict[str, Any]:
    common = {"accelerator": "cpu", "model": "tiny-llama", "replicas": 2, "resources": {"num_cpus": 0}}
    return {
        "config_file": "bench/faults.py",
        "models": [{"name": "tiny-llama", "path": model_path}],
        "pools": [
            {
                "name": "tt",
                "engine": "tt",
                **common,
                "engine_args": {"max_model_len": 512, "data_parallel_size": 1, "max_num_seqs": 8, "block_size": 32},
            },
            {
                "name": "vllm",
                "engine": "vllm",
                **common,
                "engine_args": {
                    "max_model_len": 512,
                    "max_num_seqs": 8,
                    "dtype": "float32",
                    "enforce_eager": True,
                    "block_size": 32,
                },
            },
        ],
        "router": {"stats_period_s": 0.5},
        "ingress": {"max_concurrent_requests": capacity},
    }


async def replica_kill(base: str, streams: int, max_tokens: int, hang_s: float) -> dict[str, Any]:
    url = f"{base}/v1/completions"
    prompts = clients.prompts(streams)
    pools = ["tt" if i % 2 == 0 else "vllm" for i in range(streams)]
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        refs = [await clients.reference(client, url, pool, p, max_tokens) for pool, p in zip(pools, prompts)]
        events = [asyncio.Event() for _ in prompts]
        tasks = [
            asyncio.ensure_future(clients.stream(client, url, pool, p, max_tokens, ev, hang_s))
            for pool, p, ev in zip(pools, prompts, events)
        ]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 300)
        killed: dict[str, str] = {}
        kill_at = time.monotonic()
        for pool in ("tt", "vllm"):
            busy = [s for s in await cluster.snapshots(pool) if not isinstance(s, BaseException) and s.num_inflight > 0]
            if busy:
                victim = max(busy, key=lambda s: s.num_inflight)
                cluster.kill_actor(cluster.replica_actor_name(pool, victim.replica_id))
                killed[pool] = victim.replica_id
        results = await asyncio.gather(*tasks)
        clients_done_s = time.monotonic() - kill_at
        recovery = {}
        for pool in killed:
            await cluster.wait_replicas(pool, 2)
            recovery[pool] = round(time.monotonic() - kill_at, 2)
    outcomes = [r["outcome"] for r in results]
    exact = [r["outcome"] == "completed" and r["tokens"] == ref for r, ref in zip(results, refs)]
    usage_ok = [
        r["outcome"] == "completed"
        and r["usage"] is not None
        and r["usage"]["prompt_tokens"] == len(p)
        and r["usage"]["completion_tokens"] == max_tokens
        for r, p in zip(results, prompts)
    ]
    return {
        "streams": streams,
        "max_tokens": max_tokens,
        "killed": killed,
        "completed": outcomes.count("completed"),
        "failed": outcomes.count("failed"),
        "hung": outcomes.count("hung"),
        "token_exact": sum(exact),
        "usage_exact": sum(usage_ok),
        "all_streams_done_after_kill_s": round(clients_done_s, 2),
        "pool_back_to_2_replicas_after_kill_s": recovery,
        "errors": sorted({str(r.get("error") or r.get("status")) for r in results if r["outcome"] != "completed"}),
    }


async def router_kill(base: str, streams: int, max_tokens: int) -> dict[str, Any]:
    import ray

    from serve_app.app import ROUTER_NAME

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if f"{APP}#{ROUTER_NAME}#" in a["name"]]
    url = f"{base}/v1/completions"
    killed_at = time.monotonic()
    for name in names:
        cluster.kill_actor(name)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:
        rs = await asyncio.gather(
            *(client.post(url, json=clients.body(p, max_tokens, False)) for p in clients.prompts(streams)),
            return_exceptions=True,
        )
        statuses = [r.status_code if isinstance(r, httpx.Response) else type(r).__name__ for r in rs]
    from ray import serve

    start = time.monotonic()
    router_back_s = float("nan")
    while time.monotonic() - start < 300:
        try:
            await serve.get_deployment_handle(ROUTER_NAME, APP).snapshot.remote()
            router_back_s = time.monotonic() - killed_at
            break
        except Exception:
            await asyncio.sleep(0.25)
    return {
        "router_replicas_killed": len(names),
        "requests": streams,
        "ok": statuses.count(200),
        "failed": len(statuses) - statuses.count(200),
        "statuses": sorted({str(s) for s in statuses}),
        "router_back_after_kill_s": round(router_back_s, 2),
    }


async def disconnect_soak(
    base: str, requests: int, concurrency: int, disconnect_fraction: float, max_tokens: int, seed: int = 0
) -> dict[str, Any]:
    """Item 4: ``requests`` streams (half per pool) with ``disconnect_fraction`` of the clients
    leaving mid-stream; then every engine replica must be idle with no KV block in use."""
    import random

    rng = random.Random(seed)
    url = f"{base}/v1/completions"
    sem = asyncio.Semaphore(concurrency)
    plan = [
        (
            "tt" if i % 2 == 0 else "vllm",
            [1] + [rng.randrange(3, 1000) for _ in range(rng.randrange(4, 40))],
            rng.randrange(2, 6) if rng.random() < disconnect_fraction else None,
        )
        for i in range(requests)
    ]
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:

        async def one(pool: str, prompt: list[int], leave_after: int | None) -> str:
            async with sem:
                return await clients.disconnecting_client(client, url, pool, prompt, max_tokens, leave_after)

        t0 = time.monotonic()
        outcomes = await asyncio.gather(*(one(*p) for p in plan))
        wall = time.monotonic() - t0
    # Aborts reach the engines asynchronously: give them a moment, then look.
    settle_start = time.monotonic()
    state: dict[str, list[dict[str, int]]] = {}
    while time.monotonic() - settle_start < 30:
        state = {pool: await cluster.engine_state(pool) for pool in POOLS}
        if all(
            all(r["inflight"] == r["running"] == r["waiting"] == r["kv_used_blocks"] == 0 for r in rs)
            for rs in state.values()
        ):
            break
        await asyncio.sleep(0.5)
    return {
        "requests": requests,
        "concurrency": concurrency,
        "disconnect_fraction": disconnect_fraction,
        "outcomes": {o: outcomes.count(o) for o in sorted(set(outcomes))},
        "wall_s": round(wall, 1),
        "settled_after_s": round(time.monotonic() - settle_start, 1),
        "engines_after": state,
        "leaked_kv_blocks": sum(r["kv_used_blocks"] for rs in state.values() for r in rs),
        "requests_left_in_flight": sum(
            r["inflight"] + r["running"] + r["waiting"] for rs in state.values() for r in rs
        ),
    }


async def overload(base: str, capacity: int, max_tokens: int) -> dict[str, Any]:
    url = f"{base}/v1/completions"
    n = 10 * capacity
    rss_before = cluster.ingress_rss()
    peak = rss_before
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=httpx.Limits(max_connections=n)) as client:
        t0 = time.monotonic()
        tasks = [
            asyncio.ensure_future(client.post(url, json=clients.body(p, max_tokens, False))) for p in clients.prompts(n)
        ]
        while not all(t.done() for t in tasks):
            peak = max(peak, cluster.ingress_rss())
            await asyncio.sleep(0.2)
        rs = [t.result() if not t.exception() else t.exception() for t in tasks]
        wall = time.monotonic() - t0
        after = await client.post(url, json=clients.body([1, 2, 3], 4, False))
    statuses = [r.status_code if isinstance(r, httpx.Response) else type(r).__name__ for r in rs]
    rejects = [r for r in rs if isinstance(r, httpx.Response) and r.status_code in (429, 503)]
    return {
        "capacity": capacity,
        "requests": n,
        "status_counts": {str(s): statuses.count(s) for s in sorted(set(statuses), key=str)},
        "only_200_429_503": all(s in (200, 429, 503) for s in statuses),
        "rejects_with_retry_after": sum(1 for r in rejects if r.headers.get("retry-after")),
        "rejects": len(rejects),
        "wall_s": round(wall, 2),
        "ingress_rss_mb": {
            "before": round(rss_before / 2**20, 1),
            "peak": round(peak / 2**20, 1),
            "after": round(cluster.ingress_rss() / 2**20, 1),
        },
        "recovered": after.status_code == 200,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="replica_kill,router_kill,disconnect_soak,overload,kv_actor_kill")
    parser.add_argument("--kv-path", choices=("object", "shm"), default="object")  # kv_actor_kill's data path
    parser.add_argument("--streams", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--capacity", type=int, default=32)  # >= --streams
    parser.add_argument("--hang-s", type=float, default=60.0)
    parser.add_argument("--soak-requests", type=int, default=1000)
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    from accel.envs import ENVS
    from serve_app.app import build_app

    repo = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))
    out: dict[str, Any] = {"load_average_start": os.getloadavg()}
    ray.init(address="local", num_cpus=2, object_store_memory=200 * 2**20, include_dashboard=False, log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        model = str(ENVS.checkpoint_dir / "tiny-llama")
        scenarios = args.scenarios.split(",")
        if set(scenarios) - {"kv_actor_kill"}:
            serve.run(build_app(app_args(model, args.capacity)), name=APP, route_prefix="/")
        if "kv_actor_kill" in scenarios:
            faults_pd.make_actor(args.kv_path)
            serve.run(build_app(faults_pd.pd_app_args(model, args.capacity)), name=faults_pd.PD_APP, route_prefix="/pd")
        base = f"http://127.0.0.1:{port}"
        loop = asyncio.new_event_loop()
        for name in scenarios:
            t0 = time.monotonic()
            if name == "replica_kill":
                result = loop.run_until_complete(replica_kill(base, args.streams, args.max_tokens, args.hang_s))
            elif name == "router_kill":
                result = loop.run_until_complete(router_kill(base, args.streams, 16))
            elif name == "disconnect_soak":
                result = loop.run_until_complete(disconnect_soak(base, args.soak_requests, args.capacity, 0.3, 32))
            elif name == "overload":
                result = loop.run_until_complete(overload(base, args.capacity, 16))
            elif name == "kv_actor_kill":
                pd_base = f"{base}/pd"
                result = loop.run_until_complete(
                    faults_pd.kv_actor_kill(pd_base, args.streams, args.max_tokens, args.hang_s)
                )
                result["kv_path"] = args.kv_path
            else:
                raise SystemExit(f"unknown scenario {name!r}")
            result["scenario_s"] = round(time.monotonic() - t0, 1)
            out[name] = result
            print(json.dumps({name: result}), file=sys.stderr, flush=True)
    finally:
        out["load_average_end"] = os.getloadavg()
        if "kv_actor_kill" in args.scenarios:
            faults_pd.remove_actor()  # detached: outlives Serve (and its tmpfs store would too)
        serve.shutdown()
        ray.shutdown()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
