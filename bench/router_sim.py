"""Router simulator: ``python bench/router_sim.py --json``.

Replays one seeded synthetic trace (multi-turn chat sessions + shared-system-prompt groups, see
``router_sim_workload``) through a modelled cluster (``router_sim_cluster``: N replicas, finite
engine KV each, a service-time model so load matters) once per policy, and prints ONE JSON
object: per policy the engine-side prefix hit rate in tokens, its ratio to an oracle (one global
LRU cache of the same total size fed the same trace), load imbalance (max over mean of the
time-averaged requests in system per replica), TTFT in simulated seconds, and decision latency
measured on this machine at 64 replicas with >= 100k cached blocks in the router's index.

Entries with ``/4routers`` run the default policy on 4 router replicas at once
(``router_sim_multi``): each request decided by its rendezvous owner, every router fed every KV
event and stats report and its peers' in-flight counts every 0.1 s (``-no-peer-load``: without
those) — what splitting the router costs.

Peers: ``ray_prefix_cache_affinity`` is Ray Serve 2.60's own PrefixCacheAffinityRouter — the
class and its PrefixTreeActor imported from the installed ray and driven through Serve's routing
path with running-replica fakes (``router_sim_ray``; needs a small local Ray, started here) — with
its 2.60 default ``imbalanced_threshold=inf`` and, as ``ray_prefix_cache_affinity@10``, the 2.50
default 10. Its decision latency includes the router's blocking ``ray.get`` calls on the tree
actor, as in Serve.

Engine signals reach our router as in the deployment (``router_sim_cluster``): stats and KV
events in a poll every ``--stats-period-s`` (0.5 s), events visible ``--kv-event-delay-s`` after
the engine's store; ``--instant-kv-events`` delivers events at once instead.

Default weights: chosen on this script's default trace (seed 0: multi-turn chat + shared system
prompt groups); ``bench/router_sim_validate.py`` checks them on held-out trace families.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from router_sim_cluster import ClusterConfig, oracle_hit_tokens, simulate  # noqa: E402
from router_sim_multi import MultiCoreSimRouter  # noqa: E402
from router_sim_ray import RaySimRouter  # noqa: E402
from router_sim_workload import TraceRequest, WorkloadConfig, make_trace  # noqa: E402

from accel.block_hash import hash_prompt_blocks  # noqa: E402
from accel.contract import EngineStats  # noqa: E402
from deployments.router.core.load import PEER_LOAD_PERIOD_S  # noqa: E402
from deployments.router.core.policy import CostWeights  # noqa: E402
from deployments.router.core.router_core import ReplicaInfo, RequestInfo, RouterConfig, RouterCore  # noqa: E402
from deployments.router.kv_events import BlockStored, KVEvent  # noqa: E402

MODEL = "sim-model"


class CoreSimRouter:
    """A ``RouterCore`` driven by the simulator (clock = simulated time).

    ``speculative`` (a prototype, not the core's behaviour): in precise mode, also record the
    chosen replica's prompt blocks at dispatch, as if the engine had reported them already — what
    llm-d's ``speculativeIndexing`` and vllm-router's kv_aware ``speculative_insert`` do to bridge
    the KV-event lag (here without their TTL: a prediction the engine never confirms stays until
    the index's LRU bound drops it)."""

    def __init__(
        self,
        policy: str,
        index_mode: str,
        replica_ids: Sequence[str],
        num_kv_blocks: int,
        block_size: int,
        weights: CostWeights,
        speculative: bool = False,
    ) -> None:
        self.now_s = 0.0
        self._speculative = speculative
        config = RouterConfig(policy=policy, index_mode=index_mode, block_size=block_size, weights=weights)
        self.core = RouterCore(config, clock=lambda: self.now_s)
        for r in replica_ids:
            self.core.add_replica(ReplicaInfo(r, (MODEL,), num_kv_blocks))

    @staticmethod
    def request_info(req: TraceRequest) -> RequestInfo:
        return RequestInfo(
            req.request_id,
            MODEL,
            session_key=req.session_key,
            block_hashes=req.prompt_hashes,
            num_prompt_tokens_hint=len(req.prompt_token_ids),
        )

    def choose(self, req: TraceRequest, now_s: float) -> str:
        self.now_s = now_s
        replica_id = self.core.route(self.request_info(req)).replica_id
        if self._speculative and req.prompt_hashes:
            self.core.apply_kv_events(replica_id, [BlockStored(req.prompt_hashes)])
        return replica_id

    def on_completed(self, req: TraceRequest, now_s: float) -> None:
        self.now_s = now_s
        self.core.on_completed(req.request_id)

    def on_kv_events(self, replica_id: str, events: list[KVEvent]) -> None:
        self.core.apply_kv_events(replica_id, events)

    def on_stats(self, replica_id: str, stats: EngineStats) -> None:
        self.core.apply_stats(replica_id, stats)


# (entry name, factory(replica_ids, kv blocks per replica, block size, weights, seed))
RouterFactory = Callable[[Sequence[str], int, int, CostWeights, int], object]


def _core(policy: str, mode: str = "approximate", speculative: bool = False) -> RouterFactory:
    return lambda ids, kv, bs, w, seed: CoreSimRouter(policy, mode, ids, kv, bs, w, speculative)


def _multi(num_routers: int, policy: str, mode: str, peer_period_s: float | None = PEER_LOAD_PERIOD_S) -> RouterFactory:
    return lambda ids, kv, bs, w, seed: MultiCoreSimRouter(num_routers, policy, mode, ids, kv, bs, w, peer_period_s)


def _ray(threshold: float) -> RouterFactory:
    return lambda ids, kv, bs, w, seed: RaySimRouter(ids, threshold, seed)


ENTRIES: dict[str, RouterFactory] = {
    "round_robin": _core("round_robin"),
    "least_loaded": _core("least_loaded"),
    "prefix": _core("prefix"),
    "session": _core("session"),
    "prefix+session+load": _core("prefix+session+load"),
    "prefix+session+load@precise": _core("prefix+session+load", "precise"),
    # Prototype: precise index + speculative entries at dispatch (bridges the poll/event lag).
    "prefix+session+load@precise+speculative": _core("prefix+session+load", "precise", speculative=True),
    # The same policy decided by 4 router replicas (``router_sim_multi``): what agreement costs.
    "prefix+session+load/4routers": _multi(4, "prefix+session+load", "approximate"),
    "prefix+session+load@precise/4routers": _multi(4, "prefix+session+load", "precise"),
    # ... without the routers' peer load broadcast: others' load only from engine stats reports.
    "prefix+session+load@precise/4routers-no-peer-load": _multi(4, "prefix+session+load", "precise", None),
    "ray_prefix_cache_affinity": _ray(math.inf),
    "ray_prefix_cache_affinity@10": _ray(10.0),
}


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def run_policy(
    name: str,
    trace: list[TraceRequest],
    cluster: ClusterConfig,
    weights: CostWeights,
    oracle_hit_rate: float,
    seed: int,
) -> dict:
    ids = [f"replica-{i:02d}" for i in range(cluster.num_replicas)]
    router = ENTRIES[name](ids, cluster.kv_blocks_per_replica, cluster.block_size, weights, seed)
    try:
        result = simulate(trace, cluster, router, ids)
    finally:
        if isinstance(router, RaySimRouter):
            router.close()
    hit_rate = result.num_hit_tokens / max(1, result.num_prompt_tokens)
    loads = result.load_per_replica
    mean_load = statistics.fmean(loads)
    return {
        "policy": name,
        "hit_rate": round(hit_rate, 4),
        "hit_ratio_vs_oracle": round(hit_rate / oracle_hit_rate, 4) if oracle_hit_rate else None,
        "max_over_mean_load": round(max(loads) / mean_load, 4) if mean_load else None,
        "mean_load": round(mean_load, 2),  # time-averaged requests in system per replica
        "ttft_mean_s": round(statistics.fmean(result.ttft_s), 3),
        "ttft_p99_s": round(_percentile(result.ttft_s, 0.99), 3),
    }


def measure_latency(
    name: str,
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
    router = ENTRIES[name](ids, kv_blocks, block_size, weights, seed)
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
            router.core.apply_snapshot(replica_id, list(held))
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
            info = router.request_info(req)
            c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
            decision = router.core.choose(info)
            t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
            router.core.on_dispatched(info, decision)
            if router.core.config.index_mode == "precise":  # the engine's report of the prompt
                router.core.apply_kv_events(decision.replica_id, [BlockStored(req.prompt_hashes)])
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
        "decision_p50_us": round(_percentile(decide_ns, 0.50) / 1000, 1),
        "decision_p99_us": round(_percentile(decide_ns, 0.99) / 1000, 1),
        "decision_cpu_p99_us": round(_percentile(decide_cpu_ns, 0.99) / 1000, 1),
        "dispatch_p50_us": round(_percentile(dispatch_ns, 0.50) / 1000, 1),
        "dispatch_p99_us": round(_percentile(dispatch_ns, 0.99) / 1000, 1),
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
        "hash_p50_us": round(_percentile(timed, 0.5) / 1000, 1),
        "hash_p99_us": round(_percentile(timed, 0.99) / 1000, 1),
    }


def _pair(text: str) -> tuple[int, int]:
    low, high = (int(x) for x in text.split(","))
    return low, high


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the JSON object (the only output)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--kv-blocks", type=int, default=1024, help="engine KV blocks per replica")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument(
        "--stats-period-s",
        type=float,
        default=ClusterConfig.stats_period_s,
        help="the router's poll of every engine (stats + KV events; the deployment's router.stats_period_s)",
    )
    p.add_argument("--kv-event-delay-s", type=float, default=ClusterConfig.kv_event_delay_s)
    p.add_argument("--instant-kv-events", action="store_true", help="deliver KV events at once, not at polls")
    p.add_argument("--duration-s", type=float, default=WorkloadConfig.duration_s)
    p.add_argument("--sessions", type=int, default=240)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--groups", type=int, default=24)
    p.add_argument("--group-system-tokens", type=int, default=1536)
    p.add_argument("--shared-requests", type=int, default=3000)
    p.add_argument("--burst-size", default="1,1", help="min,max shared-prompt siblings per arrival instant")
    p.add_argument("--group-zipf-alpha", type=float, default=0.0, help="0: groups equally popular")
    p.add_argument("--session-context-tokens", default="0,0", help="min,max private context per chat session")
    p.add_argument("--w-load-blocks", type=float, default=CostWeights.w_load_blocks)
    p.add_argument("--window-abs", type=float, default=CostWeights.window_abs)
    p.add_argument("--window-rel", type=float, default=CostWeights.window_rel)
    p.add_argument("--policies", default=",".join(ENTRIES), help="comma-separated entries to run")
    p.add_argument("--latency-replicas", type=int, default=64)
    p.add_argument("--latency-cached-blocks", type=int, default=100_000)
    p.add_argument("--latency-decisions", type=int, default=2000)
    p.add_argument("--no-latency", action="store_true")
    args = p.parse_args(argv)

    weights = CostWeights(w_load_blocks=args.w_load_blocks, window_abs=args.window_abs, window_rel=args.window_rel)
    workload = WorkloadConfig(
        seed=args.seed,
        block_size=args.block_size,
        duration_s=args.duration_s,
        num_sessions=args.sessions,
        num_turns=args.turns,
        num_groups=args.groups,
        group_system_tokens=args.group_system_tokens,
        num_shared_requests=args.shared_requests,
        burst_size=_pair(args.burst_size),
        group_zipf_alpha=args.group_zipf_alpha,
        session_context_tokens=_pair(args.session_context_tokens),
    )
    cluster = ClusterConfig(
        num_replicas=args.replicas,
        kv_blocks_per_replica=args.kv_blocks,
        block_size=args.block_size,
        max_batch=args.max_batch,
        stats_period_s=args.stats_period_s,
        kv_event_delay_s=args.kv_event_delay_s,
        kv_events_at_poll=not args.instant_kv_events,
    )
    started = time.perf_counter()
    trace = make_trace(workload)
    hits, prompt = oracle_hit_tokens(trace, cluster.num_replicas * cluster.kv_blocks_per_replica, cluster.block_size)
    oracle = hits / prompt
    names = [n for n in args.policies.split(",") if n]
    unknown = [n for n in names if n not in ENTRIES]
    if unknown:
        p.error(f"unknown policies {unknown}; known: {list(ENTRIES)}")
    # Ray's router needs a local Ray, started at its first entry: run ours first, simulation and
    # latency both, so our decision timings are taken before Ray's threads share this process.
    names.sort(key=lambda n: n.startswith("ray_"))
    # Many more sessions and groups, so the index really holds >= 100k distinct blocks.
    latency_trace = (
        []
        if args.no_latency
        else make_trace(
            replace(workload, seed=args.seed + 1, num_sessions=1600, num_groups=256, num_shared_requests=4000)
        )
    )
    kv_blocks = math.ceil(args.latency_cached_blocks * 1.25 / args.latency_replicas)
    entries = {}
    for name in names:
        entries[name] = run_policy(name, trace, cluster, weights, oracle, args.seed)
        if args.no_latency or "routers" in name:  # one decision is one RouterCore's, as in the single-router entry
            continue
        gc.collect()
        entries[name].update(
            measure_latency(
                name,
                latency_trace,
                args.latency_replicas,
                kv_blocks,
                args.block_size,
                weights,
                args.latency_cached_blocks,
                args.latency_decisions,
                args.seed,
            )
        )
    latency_info = {}
    if not args.no_latency:
        latency_info = {
            "replicas": args.latency_replicas,
            "kv_blocks_per_replica": kv_blocks,
            "min_cached_blocks": args.latency_cached_blocks,
            **measure_hashing(latency_trace, args.block_size, 2000),
        }
    entries = {name: entries[name] for name in sorted(entries, key=list(ENTRIES).index)}

    out = {
        "bench": "router_sim",
        "workload": {**asdict(workload), "num_requests": len(trace)},
        "cluster": asdict(cluster),
        "weights": asdict(weights),
        "oracle_hit_rate": round(oracle, 4),
        "policies": entries,
        "latency": latency_info,
        "targets": {
            "policy": "prefix+session+load",
            "hit_ratio_vs_oracle_min": 0.95,
            "max_over_mean_load_max": 1.25,
            "decision_p99_us_max": 200,
        },
        "runtime_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
