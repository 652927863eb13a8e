"""KV transfer benchmark: payload bandwidth through the KV-connector actor vs a plain memcpy, and
prefill/decode disaggregation vs colocated serving under a mixed long/short load.

    python bench/kv_transfer.py --json

1. ``bandwidth_vs_memcpy[size]`` = (bytes / transfer time) / (bytes / memcpy time), medians of
   ``--reps``. Transfer = what a PD hand-off costs beyond the engines' own KV reads/writes,
   through ``RayKVTransport`` as engines use it: producer ``put`` + consumer ``fetch`` (a
   zero-copy view) + ``complete``. Payloads up to the connector's ``shm_max_payload_bytes``
   (``--shm-max-mib``, 64 MiB as the connector's default) take the node's shared-memory store (one
   copy into tmpfs, file and ``flock`` operations, no RPC); larger ones the object store (one
   ``ray.put`` copy, a store RPC and a
   claim RPC). ``path`` says which. memcpy = ``clone()`` of the same tensor, measured in the same
   run. Sizes <= 16 MiB also get ``pipelined_bandwidth_vs_memcpy``: throughput with
   ``--in-flight`` overlapping hand-offs.
2. Mixed load on two TT engines (torch mesh model, tiny Llama) either way, each engine in its own
   process (a Ray actor, as a Serve replica is), pinned to its own core (``--no-pin``: unpinned)
   with torch on one thread; fresh replicas per setup, warmed on prompts outside the workload (no
   measured prompt is in a prefix cache). Colocated = both replicas serve whole requests (fewer
   in flight); PD = replica A prefills, replica B decodes, each request placed by the router's
   own ``RouterCore`` at the config's PD defaults (``--pd-threshold``, ``--pd-busy-threshold``:
   prompts of at least the threshold, and shorter ones while B has requests in flight and A has
   none, go prefill -> actor -> decode via ``PDOrchestrator``; the rest straight to B). Token stamps
   are taken in the replica as the engine emits each delta (CLOCK_MONOTONIC, comparable across
   processes); ``client_*`` = the same stamped at the bench driver after Ray's streaming hop.
   ``itl_p99_ratio`` = PD / colocated p99 gap between streamed tokens (all requests; p99.9 is
   reported too); ``ttft_p50_ratio`` = PD / colocated median time to first token (request sent
   by the driver -> first token stamped in the replica).
Greedy outputs of every PD request are checked equal to the colocated run's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from accel.envs import ENVS  # noqa: E402
from serve_app.config.pd import PDConfig  # noqa: E402

MIB = 1 << 20
APP = "kv-bench"
BLOCK_SIZE, MAX_MODEL_LEN, MAX_NUM_SEQS = 32, 2048, 16  # each TT engine's


def bandwidth(sizes_mib: list[int], reps: int, in_flight: int) -> dict:
    from accel.kv_transfer.payload import KVDescriptor, KVPayload
    from deployments.kv.ray_transport import RayKVTransport

    transport = RayKVTransport(APP)
    out = {}
    for size in sizes_mib:
        # [L=4, 2, T, Hkv=2, D=32] fp32 = 2 KiB per token: T = size * 512 tokens.
        tokens = size * 512
        desc = KVDescriptor.for_prompt("bench", torch.float32, 4, 2, 32, list(range(tokens)), 32)
        payload = KVPayload(desc, torch.randn(desc.shape))
        assert desc.num_bytes == size * MIB
        transfer_s, memcpy_s = [], []
        for i in range(reps + 1):
            t0 = time.perf_counter()
            transport.put(f"b{size}-{i}", payload, timeout_s=30)
            got = transport.fetch(f"b{size}-{i}", timeout_s=30)
            transport.complete(f"b{size}-{i}")
            t1 = time.perf_counter()
            assert got.kv.shape == payload.kv.shape
            del got
            t2 = time.perf_counter()
            copy = payload.kv.clone()
            t3 = time.perf_counter()
            del copy
            if i:  # the first round warms the object store's pages
                transfer_s.append(t1 - t0)
                memcpy_s.append(t3 - t2)
        tr, mc = statistics.median(transfer_s), statistics.median(memcpy_s)
        piped_s = _pipelined(transport, payload, size, in_flight) if size <= 16 else None
        store = transport._shm()  # the same decision RayKVTransport.put makes
        path = "shm" if store is not None and size * MIB <= store.max_payload_bytes else "object"
        out[f"{size}MiB"] = {
            "path": path,
            "transfer_ms": round(tr * 1e3, 3),
            "memcpy_ms": round(mc * 1e3, 3),
            "transfer_gbps": round(size * MIB / tr / 1e9, 2),
            "memcpy_gbps": round(size * MIB / mc / 1e9, 2),
            "bandwidth_vs_memcpy": round(mc / tr, 3),
        }
        if piped_s is not None:
            out[f"{size}MiB"]["pipelined_bandwidth_vs_memcpy"] = round(mc / piped_s, 3)
    return out


def _pipelined(transport, payload, size: int, in_flight: int, num: int = 32) -> float:
    """Seconds per transfer with ``in_flight`` hand-offs overlapping (throughput, not latency)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i):
        tid = f"p{size}-{i}"
        transport.put(tid, payload, timeout_s=30)
        transport.fetch(tid, timeout_s=30)
        transport.complete(tid)

    with ThreadPoolExecutor(in_flight) as pool:
        list(pool.map(one, range(in_flight)))  # warm
        t0 = time.perf_counter()
        list(pool.map(one, range(in_flight, in_flight + num)))
        return (time.perf_counter() - t0) / num


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
    from deployments.pd.orchestrator import PDOrchestrator
    from deployments.router.core.router_core import ReplicaInfo, RouterCore
    from deployments.router.messages import RouteRequest
    from serve_app.config.router import ModelRouting, RouterConfig

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
    router = RouterCore(RouterConfig(), {"m": ModelRouting(BLOCK_SIZE, args.pd_threshold, args.pd_busy_threshold)})
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
    model = str(Path(args.model).expanduser())
    workload = _workload(args)
    base, _, affinity = _run_setup(args, model, workload, is_pd=False)
    disagg, pd_counts, _ = _run_setup(args, model, workload, is_pd=True)
    mismatches = sum(1 for x, y in zip(base, disagg) if x["tokens"] != y["tokens"])

    def summary(results):
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

    c, p = summary(base), summary(disagg)
    return {
        "colocated": c,
        "pd": p,
        "itl_p99_ratio": round(p["itl_p99_ms"] / c["itl_p99_ms"], 3),
        "ttft_p50_ratio": round(p["ttft_p50_ms"] / c["ttft_p50_ms"], 3),
        "client_itl_p99_ratio": round(p["client_itl_p99_ms"] / c["client_itl_p99_ms"], 3),
        "num_requests": len(workload),
        "num_long": sum(r["is_long"] for r in base),
        "num_output_mismatches": mismatches,
        "pd_recomputes": pd_counts["recomputes"],
        "num_disaggregated": pd_counts["num_disaggregated"],
        "pd_threshold_tokens": args.pd_threshold,
        "pd_busy_decode_threshold_tokens": args.pd_busy_threshold,
        "replica_cores": affinity,
    }


def _pct(sorted_values, q):
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--sizes-mib", default="1,4,16,64,256")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--in-flight", type=int, default=4, help="overlapping transfers in the pipelined figure")
    parser.add_argument("--model", default=str(ENVS.checkpoint_dir / "tiny-llama"))
    parser.add_argument("--num-requests", type=int, default=48)
    parser.add_argument("--rate", type=float, default=3.0, help="arrivals per second (3: busy, not saturated here)")
    parser.add_argument("--long-every", type=int, default=6)
    parser.add_argument("--long-tokens", type=int, default=1800)
    parser.add_argument("--short-output", type=int, default=48)
    parser.add_argument(
        "--pd-threshold", type=int, default=PDConfig.threshold_tokens, help="pd.threshold_tokens (config default)"
    )
    parser.add_argument(
        "--pd-busy-threshold",
        type=lambda v: None if v.lower() in ("none", "null") else int(v),
        default=PDConfig.busy_decode_threshold_tokens,
        help="pd.busy_decode_threshold_tokens (config default; none: off)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-mixed", action="store_true")
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="leave the two engine replicas unpinned (default: one core each)",
    )
    parser.add_argument(
        "--shm-max-mib",
        type=int,
        default=64,
        help="largest payload through the shared-memory store (0: object store only)",
    )
    args = parser.parse_args()

    import ray

    from deployments.kv.connector_actor import KVConnectorConfig, get_or_create_kv_connector, kill_kv_connector

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    sizes = [int(s) for s in args.sizes_mib.split(",")]
    ray.init(
        address="local",
        num_cpus=1,
        object_store_memory=max(sizes) * 3 * MIB + 200 * MIB,
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        get_or_create_kv_connector(
            APP,
            KVConnectorConfig(
                capacity_bytes=max(sizes) * 2 * MIB + 64 * MIB, shm_max_payload_bytes=args.shm_max_mib * MIB
            ),
        )
        result = {"bandwidth": bandwidth(sizes, args.reps, args.in_flight)}
        result["bandwidth_vs_memcpy_min_ge_1MiB"] = min(v["bandwidth_vs_memcpy"] for v in result["bandwidth"].values())
        if not args.skip_mixed:
            result["mixed_load"] = mixed_load(args)
            result["itl_p99_ratio"] = result["mixed_load"]["itl_p99_ratio"]
            result["ttft_p50_ratio"] = result["mixed_load"]["ttft_p50_ratio"]
        result["machine"] = {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    finally:
        kill_kv_connector(APP)  # also removes the shared-memory store from /dev/shm
        ray.shutdown()
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
