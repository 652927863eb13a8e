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
   own ``RouterLogic`` at the config's PD defaults (``--pd-threshold``, ``--pd-busy-threshold``:
   prompts of at least the threshold, and shorter ones while B has requests in flight and A has
   none, go prefill -> actor -> decode via ``PDOrchestrator``; the rest straight to B). Token stamps
   are taken in the replica as the engine emits each delta (CLOCK_MONOTONIC, comparable across
   processes); ``client_*`` = the same stamped at the bench driver after Ray's streaming hop.
   ``itl_p99_ratio`` = PD / colocated p99 gap between streamed tokens (all requests; p99.9 is
   reported too); ``ttft_p50_ratio`` = PD / colocated median time to first token (request sent
   by the driver -> first token stamped in the replica). ``--rounds`` (3) rounds, each a fresh
   workload (``--seed`` + round), colocated and PD alternating which goes first; the percentiles
   pool every round's requests, ``*_rounds`` are each round's own ratios.
Greedy outputs of every PD request are checked equal to the colocated run's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from accel.envs import ENVS  # noqa: E402
from bench.kv_transfer_mixed import APP, mixed_load  # noqa: E402
from deployments.config.pd import PDConfig  # noqa: E402

MIB = 1 << 20


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
    parser.add_argument(
        "--rounds", type=int, default=3, help="mixed-load rounds (workload seed + round; order alternating)"
    )
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
