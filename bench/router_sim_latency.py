"""Decision latency of the simulator's routers on this machine (``router_sim.py`` without
``--no-latency``): every router preloaded with the same state, then timed per decision."""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence

from router_sim_core import CoreSimRouter
from router_sim_ray import RaySimRouter
from router_sim_workload import TraceRequest

from accel.block_hash import hash_prompt_blocks
from accel.contract import EngineStats
from deployments.config.router import CostWeights
from deployments.messages.kv_events import BlockStored


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def measure_latency(
    factory,  # router_sim.RouterFactory of the entry
    trace: list[TraceRequest],
    num_replicas: int,
    kv_blocks: int,
    block_size: int,
    weights: CostWeights,
    min_cached_blocks: int,
    num_timed: int,
    seed: int,
) -> dict:
    """Preload every router with the same state — the trace's first requests spread over the
    replicas (index snapshots; for the char-tree peer, its inserts) until >= ``min_cached_blocks``
    blocks are held — then time ``num_timed`` decisions on the following requests, completions
    lagging 256 requests behind, fresh engine stats for every replica. ``decision`` = choosing
    (index lookup + policy, hashes given by the ingress); ``dispatch`` = the bookkeeping after it
    (in-flight, sessions, index insert)."""
    ids = [f"replica-{i:02d}" for i in range(num_replicas)]
    router = factory(ids, kv_blocks, block_size, weights, seed)
    per_replica: dict[str, dict[int, None]] = {r: {} for r in ids}
    num_preloaded = num_blocks = 0
    for i, req in enumerate(trace):
        if num_blocks >= min_cached_blocks:
            break
        replica_id = ids[i % num_replicas]
        held = per_replica[replica_id]
        before = len(held)
        held.update(dict.fromkeys(req.full_hashes))
        num_blocks += len(held) - before
        if isinstance(router, RaySimRouter):
            router.preload(req.text(), replica_id)
        num_preloaded += 1
    if isinstance(router, CoreSimRouter):
        for replica_id, held in per_replica.items():
            router.logic.apply_snapshot(replica_id, list(held))
    decide_ns: list[int] = []
    decide_cpu_ns: list[int] = []  # this thread's CPU time: excludes preemption by other processes
    dispatch_ns: list[int] = []
    window: list[TraceRequest] = []
    gc.collect()
    gc.freeze()  # the preloaded state is long-lived: keep full collections from walking it
    for i, req in enumerate(trace[num_preloaded : num_preloaded + num_timed]):
        now_s = i * 0.001  # 1000 decisions per second; engine stats arrive every second
        if isinstance(router, CoreSimRouter):
            router.now_s = now_s
            if i % 1000 == 0:
                for n, replica_id in enumerate(ids):
                    router.on_stats(
                        replica_id,
                        EngineStats(
                            num_waiting=n % 3,
                            num_running=8,
                            num_kv_blocks_total=kv_blocks,
                            num_kv_blocks_free=kv_blocks // (1 + n % 4),
                        ),
                    )
            route = router.route_request(req)
            c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
            decision = router.logic.choose(route)
            t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
            router.logic.on_dispatched(route, decision)
            if router.logic.config.index_mode == "precise":  # the engine's report of the prompt
                router.logic.apply_kv_events(decision.replica_id, [BlockStored(req.prompt_hashes)])
            t2 = time.perf_counter_ns()
        else:  # Ray's router decides and inserts in one call path (its tree actor RPCs included)
            c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
            router.choose(req, now_s)
            t1 = t2 = time.perf_counter_ns()
            c1 = time.thread_time_ns()
        decide_ns.append(t1 - t0)
        decide_cpu_ns.append(c1 - c0)
        dispatch_ns.append(t2 - t1)
        window.append(req)
        if len(window) > 256:
            router.on_completed(window.pop(0), now_s)
    if isinstance(router, RaySimRouter):
        router.close()
    return {
        "decision_p50_us": round(percentile(decide_ns, 0.50) / 1000, 1),
        "decision_p99_us": round(percentile(decide_ns, 0.99) / 1000, 1),
        "decision_cpu_p99_us": round(percentile(decide_cpu_ns, 0.99) / 1000, 1),
        "dispatch_p50_us": round(percentile(dispatch_ns, 0.50) / 1000, 1),
        "dispatch_p99_us": round(percentile(dispatch_ns, 0.99) / 1000, 1),
        "latency_preloaded_blocks": num_blocks,
        "latency_num_timed": len(decide_ns),
    }


def measure_hashing(trace: Sequence[TraceRequest], block_size: int, num: int) -> dict:
    """What the ingress pays to hash a prompt (kept off the router's thread)."""
    timed = []
    for req in trace[:num]:
        t0 = time.perf_counter_ns()
        hash_prompt_blocks(req.prompt_token_ids, block_size)
        timed.append(time.perf_counter_ns() - t0)
    return {
        "hash_p50_us": round(percentile(timed, 0.5) / 1000, 1),
        "hash_p99_us": round(percentile(timed, 0.99) / 1000, 1),
    }
