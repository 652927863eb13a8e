"""``bench/kv_transfer.py``'s second part: PD vs colocated serving of two TT engines, each in its
own process (a Ray actor, as a Serve replica is), under a mixed long/short load (see that
script's docstring for the method and its keys)."""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import torch

APP = "kv-bench"
BLOCK_SIZE, MAX_MODEL_LEN, MAX_NUM_SEQS = 32, 2048, 16  # each TT engine's


def _engine(model_dir: str, hooks):
    from accel.tt.config import TTEngineConfig
    from accel.tt.engine import TTMeshEngine
    from accel.tt.torch_model import TorchMeshModel

    config = TTEngineConfig.from_engine_args(
        dict(
            model=model_dir,
            max_num_seqs=MAX_NUM_SEQS,
            data_parallel_size=1,
            block_size=BLOCK_SIZE,
            max_model_len=MAX_MODEL_LEN,
            max_num_batched_tokens=512,
            async_scheduling=True,
            additional_config={"tt": {"enable_model_warmup": False}},
        )
    )
    return TTMeshEngine(config, model_class=TorchMeshModel, kv_hooks=hooks)


def _pin_process(cores: set[int]) -> None:
    """Every thread of this process (Ray's gRPC/core-worker threads included) onto ``cores``;
    threads started later (the engine's step loop and device queue) inherit it."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # a thread that just exited
            pass


class EngineReplica:
    """One TT engine in its own process (a Ray actor, as a Serve replica is), optionally pinned to
    one core, with torch on one thread. ``generate`` streams ``(delta, stamp)``: ``stamp`` =
    ``time.perf_counter()`` (CLOCK_MONOTONIC, comparable across processes of this machine) when
    the replica produced the delta, so token gaps are measured where the engine emits them, not
    after Ray's per-item streaming hop to the bench driver (reported separately as ``client_*``)."""

    def __init__(self, model_dir: str, app: str, core: int | None):
        if core is not None:
            _pin_process({core})
        torch.set_num_threads(1)
        from accel.tt.kv_hooks import KVTransferHooks
        from deployments.kv.ray_transport import RayKVTransport

        self.engine = _engine(model_dir, KVTransferHooks(RayKVTransport(app), model_dir))

    async def generate(self, request):
        async for delta in self.engine.generate(request):
            yield delta, time.perf_counter()

    def affinity(self) -> list[int]:
        return sorted(os.sched_getaffinity(0))

    def close(self) -> None:
        self.engine.close()


def _workload(args, seed: int | None = None) -> list[tuple[float, tuple[int, ...], int]]:
    """(arrival s, prompt, max_tokens): short chats with a few long documents mixed in."""
    rng = random.Random(args.seed if seed is None else seed)
    items, t = [], 0.0
    for i in range(args.num_requests):
        t += rng.expovariate(args.rate)
        is_long = i % args.long_every == 0
        n = rng.randint(args.long_tokens // 2, args.long_tokens) if is_long else rng.randint(16, 64)
        items.append((t, tuple(rng.randrange(3, 1024) for _ in range(n)), 8 if is_long else args.short_output))
    return items


async def _serve(workload, route, replica_stamps: dict[str, list[float]]) -> list[dict]:
    """Replay ``workload`` through ``route`` (request -> async iterator of deltas); the replicas
    append their token stamps to ``replica_stamps[request_id]``."""
    from accel.contract import GenerateRequest, SamplingParams

    async def one(i, arrival, prompt, max_tokens, start):
        await asyncio.sleep(max(0.0, start + arrival - time.perf_counter()))
        req = GenerateRequest(f"q{i}", prompt, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
        sent, client, tokens = time.perf_counter(), [], []
        async for delta in route(req):
            if delta.new_token_ids:
                client.append(time.perf_counter())
                tokens.extend(delta.new_token_ids)
        stamps = replica_stamps.pop(req.request_id)
        return {
            "ttft": stamps[0] - sent,
            "gaps": _gaps(stamps),
            "client_ttft": client[0] - sent,
            "client_gaps": _gaps(client),
            "tokens": tokens,
            "is_long": len(prompt) >= 256,
        }

    start = time.perf_counter()
    return await asyncio.gather(*(one(i, a, p, m, start) for i, (a, p, m) in enumerate(workload)))


def _gaps(stamps: list[float]) -> list[float]:
    return [b - a for a, b in zip(stamps, stamps[1:])]


def _run_setup(args, model: str, workload, is_pd: bool) -> tuple[list[dict], dict, list[list[int]]]:
    """Fresh replicas A and B (own processes, A on core 0 and B on core 1 when the machine has
    two), warmed on prompts outside ``workload`` (nothing measured is in a prefix cache), then
    the workload: colocated = each request to the replica with fewer in flight; PD = prompts >=
    ``--pd-threshold`` prefill on A -> actor -> decode on B, shorter ones straight to B."""
    import ray

    from accel.block_hash import hash_prompt_blocks
    from deployments.config.router import ModelRouting, RouterConfig
    from deployments.messages.routing import RouteRequest
    from deployments.pd.orchestrator import PDOrchestrator
    from deployments.router.logic.router_logic import ReplicaInfo, RouterLogic

    cores = sorted(os.sched_getaffinity(0))
    pin = [cores[0], cores[1]] if args.pin and len(cores) >= 2 else [None, None]
    actor = ray.remote(num_cpus=0)(EngineReplica)
    a, b = (actor.options(max_concurrency=1000).remote(model, APP, core) for core in pin)
    stamps: dict[str, list[float]] = {}

    def call(replica):
        async def generate(req):
            stream = replica.generate.options(num_returns="streaming").remote(req)
            async for ref in stream:
                delta, stamp = await ref
                if delta.new_token_ids:
                    stamps.setdefault(delta.request_id, []).append(stamp)
                yield delta

        return generate

    gen_a, gen_b = call(a), call(b)
    inflight = {"a": 0, "b": 0}

    async def colocated(req):
        name = min(inflight, key=inflight.get)
        inflight[name] += 1
        try:
            async for d in (gen_a if name == "a" else gen_b)(req):
                yield d
        finally:
            inflight[name] -= 1

    orch = PDOrchestrator(metrics=False)
    router = RouterLogic(RouterConfig(), {"m": ModelRouting(BLOCK_SIZE, args.pd_threshold, args.pd_busy_threshold)})
    num_blocks = MAX_MODEL_LEN * MAX_NUM_SEQS // BLOCK_SIZE
    router.add_replica(ReplicaInfo("a", "prefill", "m", num_blocks, "prefill", publishes_kv_events=False))
    router.add_replica(ReplicaInfo("b", "decode", "m", num_blocks, "decode", publishes_kv_events=False))
    num_disaggregated = [0]

    async def pd(req):
        hashes = tuple(hash_prompt_blocks(req.prompt_token_ids, BLOCK_SIZE))
        decision = router.route(RouteRequest(req.request_id, "m", req.num_prompt_tokens, prompt_block_hashes=hashes))
        try:
            if decision.prefill_replica_id is None:
                async for d in gen_b(req):
                    yield d
                return
            num_disaggregated[0] += 1
            is_prefilled = False
            async for d in orch.stream(req, gen_a, gen_b):
                if not is_prefilled:  # the decode side streams only once the prefill returned
                    router.on_prefill_done(req.request_id, "a")
                    is_prefilled = True
                yield d
        finally:
            router.on_completed(req.request_id)

    try:
        affinity = ray.get([a.affinity.remote(), b.affinity.remote()])
        warm = _workload(args, seed=args.seed + 1000)[:6]
        for gen in (gen_a, gen_b):  # both replicas' code paths, then the PD hand-off itself
            asyncio.run(_serve([(0.0, p, m) for _, p, m in warm], gen, stamps))
        if is_pd:
            asyncio.run(_serve([(0.0, p, m) for _, p, m in warm if len(p) >= args.pd_threshold], pd, stamps))
        stamps.clear()
        num_disaggregated[0] = 0
        results = asyncio.run(_serve(workload, pd if is_pd else colocated, stamps))
    finally:
        ray.get([a.close.remote(), b.close.remote()])
        ray.kill(a)
        ray.kill(b)
    return results, {"recomputes": orch.num_recomputes, "num_disaggregated": num_disaggregated[0]}, affinity


def mixed_load(args) -> dict:
    """``--rounds`` rounds, each a fresh workload (seed + round) served colocated and with PD (the
    order alternating per round); the figures pool every round's gaps and TTFTs (one p99 over
    ``rounds`` x ``num_requests`` requests: a single 48-request round's p99 rests on a handful of
    gaps), and ``*_rounds`` give each round's own ratio."""
    model = str(Path(args.model).expanduser())
    base: list[dict] = []
    disagg: list[dict] = []
    per_round: list[dict] = []
    mismatches = num_disaggregated = 0
    recomputes: dict[str, int] = {}  # reason -> count (PDOrchestrator.num_recomputes)
    affinity: list[list[int]] = []
    for round_id in range(args.rounds):
        workload = _workload(args, seed=args.seed + round_id)
        order = (False, True) if round_id % 2 == 0 else (True, False)
        runs = {}
        for is_pd in order:
            runs[is_pd] = _run_setup(args, model, workload, is_pd=is_pd)
        (b, _, affinity), (d, counts, _) = runs[False], runs[True]
        mismatches += sum(1 for x, y in zip(b, d) if x["tokens"] != y["tokens"])
        for reason, n in counts["recomputes"].items():
            recomputes[reason] = recomputes.get(reason, 0) + n
        num_disaggregated += counts["num_disaggregated"]
        c_round, p_round = _summary(b), _summary(d)
        per_round.append(
            {
                "itl_p99_ratio": round(p_round["itl_p99_ms"] / c_round["itl_p99_ms"], 3),
                "ttft_p50_ratio": round(p_round["ttft_p50_ms"] / c_round["ttft_p50_ms"], 3),
                "colocated_itl_p99_ms": c_round["itl_p99_ms"],
                "pd_itl_p99_ms": p_round["itl_p99_ms"],
            }
        )
        base += b
        disagg += d

    c, p = _summary(base), _summary(disagg)
    return {
        "colocated": c,
        "pd": p,
        "itl_p99_ratio": round(p["itl_p99_ms"] / c["itl_p99_ms"], 3),
        "ttft_p50_ratio": round(p["ttft_p50_ms"] / c["ttft_p50_ms"], 3),
        "client_itl_p99_ratio": round(p["client_itl_p99_ms"] / c["client_itl_p99_ms"], 3),
        "itl_p99_ratio_rounds": [r["itl_p99_ratio"] for r in per_round],
        "ttft_p50_ratio_rounds": [r["ttft_p50_ratio"] for r in per_round],
        "rounds": per_round,
        "num_rounds": args.rounds,
        "num_requests": len(base),
        "num_long": sum(r["is_long"] for r in base),
        "num_output_mismatches": mismatches,
        "pd_recomputes": recomputes,
        "num_disaggregated": num_disaggregated,
        "pd_threshold_tokens": args.pd_threshold,
        "pd_busy_decode_threshold_tokens": args.pd_busy_threshold,
        "replica_cores": affinity,
    }


def _summary(results: list[dict]) -> dict:
    out = {}
    for prefix in ("", "client_"):
        gaps = sorted(g for r in results for g in r[prefix + "gaps"])
        ttfts = sorted(r[prefix + "ttft"] for r in results)
        out.update(
            {
                f"{prefix}itl_p50_ms": round(_pct(gaps, 50) * 1e3, 2),
                f"{prefix}itl_p99_ms": round(_pct(gaps, 99) * 1e3, 2),
                f"{prefix}itl_p999_ms": round(_pct(gaps, 99.9) * 1e3, 2),
                f"{prefix}ttft_p50_ms": round(_pct(ttfts, 50) * 1e3, 2),
                f"{prefix}ttft_p99_ms": round(_pct(ttfts, 99) * 1e3, 2),
            }
        )
    return out


def _pct(sorted_values, q):
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]
