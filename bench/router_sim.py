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
from router_sim_core import CoreSimRouter  # noqa: E402
from router_sim_latency import measure_hashing, measure_latency, percentile  # noqa: E402
from router_sim_multi import MultiCoreSimRouter  # noqa: E402
from router_sim_ray import RaySimRouter  # noqa: E402
from router_sim_workload import TraceRequest, WorkloadConfig, make_trace  # noqa: E402

from deployments.config.router import CostWeights  # noqa: E402
from deployments.router.logic.load import PEER_LOAD_PERIOD_S  # noqa: E402

# (entry name, factory(replica_ids, kv blocks per replica, block size, weights, seed))
RouterFactory = Callable[[Sequence[str], int, int, CostWeights, int], object]


def _core(policy: str, mode: str = "approximate", speculative_ttl_s: float | None = None) -> RouterFactory:
    return lambda ids, kv, bs, w, seed: CoreSimRouter(policy, mode, ids, kv, bs, w, speculative_ttl_s)


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
    # The default: precise index with speculative entries at dispatch (router.speculative_ttl_s).
    "prefix+session+load@precise": _core("prefix+session+load", "precise"),
    # ... and without them: only what the engines' (polled) KV events confirmed.
    "prefix+session+load@precise-no-speculative": _core("prefix+session+load", "precise", 0.0),
    # The same policy decided by 4 router replicas (``router_sim_multi``): what agreement costs.
    "prefix+session+load/4routers": _multi(4, "prefix+session+load", "approximate"),
    "prefix+session+load@precise/4routers": _multi(4, "prefix+session+load", "precise"),
    # ... without the routers' peer load broadcast: others' load only from engine stats reports.
    "prefix+session+load@precise/4routers-no-peer-load": _multi(4, "prefix+session+load", "precise", None),
    "ray_prefix_cache_affinity": _ray(math.inf),
    "ray_prefix_cache_affinity@10": _ray(10.0),
}


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
        "ttft_p99_s": round(percentile(result.ttft_s, 0.99), 3),
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
    p.add_argument("--chat-system-prompts", type=int, default=WorkloadConfig.num_chat_system_prompts)
    p.add_argument("--chat-system-tokens", type=int, default=WorkloadConfig.chat_system_tokens)
    p.add_argument("--chat-zipf-alpha", type=float, default=0.0, help="0: sessions take the chat prompts in turn")
    p.add_argument("--think-s", type=float, default=WorkloadConfig.think_s, help="mean pause between a session's turns")
    p.add_argument("--est-turn-s", type=float, default=WorkloadConfig.est_turn_s, help="a turn's expected latency")
    p.add_argument("--user-tokens", default="32,192", help="min,max new user tokens per chat turn")
    p.add_argument("--answer-tokens", default="64,256", help="min,max answer tokens a chat history grows by")
    p.add_argument("--chat-output-tokens", default="0,0", help="min,max tokens a chat turn decodes (0,0: its answer)")
    p.add_argument("--w-load-blocks", type=float, default=CostWeights.w_load_blocks)
    p.add_argument("--window-abs", type=float, default=CostWeights.window_abs)
    p.add_argument("--w-session", type=float, default=CostWeights.w_session)
    p.add_argument("--window-rel", type=float, default=CostWeights.window_rel)
    p.add_argument("--policies", default=",".join(ENTRIES), help="comma-separated entries to run")
    p.add_argument("--latency-replicas", type=int, default=64)
    p.add_argument("--latency-cached-blocks", type=int, default=100_000)
    p.add_argument("--latency-decisions", type=int, default=2000)
    p.add_argument("--no-latency", action="store_true")
    args = p.parse_args(argv)

    weights = CostWeights(
        w_load_blocks=args.w_load_blocks,
        window_abs=args.window_abs,
        window_rel=args.window_rel,
        w_session=args.w_session,
    )
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
        num_chat_system_prompts=args.chat_system_prompts,
        chat_system_tokens=args.chat_system_tokens,
        chat_zipf_alpha=args.chat_zipf_alpha,
        think_s=args.think_s,
        est_turn_s=args.est_turn_s,
        user_tokens=_pair(args.user_tokens),
        answer_tokens=_pair(args.answer_tokens),
        chat_output_tokens=_pair(args.chat_output_tokens),
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
        if args.no_latency or "routers" in name:  # one decision is one RouterLogic's, as in the single-router entry
            continue
        gc.collect()
        entries[name].update(
            measure_latency(
                ENTRIES[name],
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
