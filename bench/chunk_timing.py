"""When each streamed token reaches the client: ``python bench/chunk_timing.py`` (issue 42).

Starts each server in turn (``bench/serving_servers.py``: ``bare`` vLLM's OpenAI server, ``ours``
the config's app through its port as ``make serve`` runs it, ``ours_own`` the same with every pool
in its own deployment, where deltas cross a Ray message and the replica's ``DeltaCoalescer``), then
at each ``--concurrency`` sends ``--num-requests`` streamed ``/v1/completions`` (random words,
greedy, ``ignore_eos``, ``--max-tokens``) and records the arrival time of every SSE chunk that
carries text. Per server and concurrency: TTFT p50/p99 (first text chunk), e2e p50, the tail
(e2e - TTFT) p50, text chunks per request (``max_tokens`` = one per token; fewer = tokens held and
sent together), the first inter-chunk gap p50 and output tokens/s; and where the first token's
time went: ``engine_ttft_mean_ms``, the engines' own TTFT over that load (``vllm:time_to_first_token_seconds``
from the server's ``/metrics``: a request's arrival in the engine's front to its first token;
our ingress serves its replicas' series), and ``outside_engine_ttft_mean_ms``, the client's mean
TTFT minus it: what the HTTP front, the stack and the way back add. One JSON object on stdout,
``load_average`` at each server's start and end. Run under the shared lock:
``flock /tmp/meshserve-heavy.lock .venv/bin/python bench/chunk_timing.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.router_peers_metrics import engine_ttft_mean_s, read_engine_ttft  # noqa: E402
from bench.serving_servers import (  # noqa: E402
    MAKE_SERVE_ENV,
    REPO,
    bare_vllm_command,
    free_port,
    serve_command,
    served_model_name,
    server_env,
    started,
    stop_servers_on_sigterm,
    vllm_engine_args,
)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


async def one_request(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[float]:
    """Seconds from send to each text chunk's arrival."""
    start = time.perf_counter()
    times: list[float] = []
    async with http.stream("POST", url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                times.append(time.perf_counter() - start)
    return times


async def run_load(
    url: str, model: str, concurrency: int, num: int, max_tokens: int, words: int, seed: int
) -> tuple[list[list[float]], float]:
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(3, 8))) for _ in range(500)]
    slots = asyncio.Semaphore(concurrency)
    out: list[list[float]] = []

    async def send(i: int) -> None:
        prompt = f"{i} " + " ".join(rng.choice(vocab) for _ in range(words))
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        body.update({"ignore_eos": True, "stream": True})
        async with slots:
            out.append(await one_request(http, url, body))

    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=256)) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(send(i) for i in range(num)))
        wall = time.perf_counter() - t0
    return out, wall


def engine_split(ttft_s: list[float], before: tuple[float, float], after: tuple[float, float]) -> dict[str, Any]:
    """The engines' mean TTFT over one load and what the rest of the path added to the client's."""
    client_ms = 1000 * sum(ttft_s) / len(ttft_s) if ttft_s else math.nan
    engine_s = engine_ttft_mean_s(before, after)
    if engine_s is None or not ttft_s:  # a server whose /metrics has no engine TTFT series
        return {"ttft_mean_ms": round(client_ms, 1), "engine_ttft_mean_ms": None, "outside_engine_ttft_mean_ms": None}
    engine_ms = 1000 * engine_s
    return {
        "ttft_mean_ms": round(client_ms, 1),
        "engine_ttft_mean_ms": round(engine_ms, 1),
        "outside_engine_ttft_mean_ms": round(client_ms - engine_ms, 1),
    }


def summary(runs: list[list[float]], wall: float, max_tokens: int) -> dict[str, Any]:
    ttft = [r[0] for r in runs if r]
    tail = [r[-1] - r[0] for r in runs if r]
    gap = [r[1] - r[0] for r in runs if len(r) > 1]
    return {
        "ttft_p50_ms": round(1000 * percentile(ttft, 0.5), 1),
        "ttft_p99_ms": round(1000 * percentile(ttft, 0.99), 1),
        "e2e_p50_ms": round(1000 * percentile([r[-1] for r in runs if r], 0.5), 1),
        "tail_p50_ms": round(1000 * percentile(tail, 0.5), 1),
        "first_gap_p50_ms": round(1000 * percentile(gap, 0.5), 1),
        "chunks_per_request": round(sum(len(r) for r in runs) / max(1, len(runs)), 2),
        "max_tokens": max_tokens,
        "output_tok_s": round(len(runs) * max_tokens / wall, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=REPO / "configs" / "vllm_cpu.yaml")
    p.add_argument("--servers", default="bare,ours,ours_own")
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--num-requests", type=int, default=48)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--prompt-words", type=int, default=60)
    p.add_argument("--log-dir", type=Path, default=Path("/tmp/meshserve-bench/chunk_timing"))
    opts = p.parse_args()
    opts.log_dir.mkdir(parents=True, exist_ok=True)
    stop_servers_on_sigterm()
    engine_args = vllm_engine_args(opts.config)
    model = served_model_name(opts.config)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    for k, v in {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}.items():
        env.setdefault(k, v)
    env.update({"TOKENIZERS_PARALLELISM": "false", "RAY_USAGE_STATS_ENABLED": "0", **MAKE_SERVE_ENV})
    result: dict[str, Any] = {"config": str(opts.config), "servers": {}}
    for name in [s for s in opts.servers.split(",") if s]:
        port = free_port()
        cmd = bare_vllm_command(engine_args, port, model) if name == "bare" else serve_command(name, opts.config, port)
        entry: dict[str, Any] = {"load_average_start": round(os.getloadavg()[0], 2)}
        with started(name, cmd, server_env(env), port, opts.log_dir, model=model) as server:
            asyncio.run(run_load(server.url, model, 4, 8, 4, opts.prompt_words, 999))  # warm-up
            for c in (int(x) for x in opts.concurrency.split(",")):
                metrics = [server.url + "/metrics"]
                before = asyncio.run(read_engine_ttft(metrics))
                runs, wall = asyncio.run(
                    run_load(server.url, model, c, opts.num_requests, opts.max_tokens, opts.prompt_words, c)
                )
                split = engine_split([r[0] for r in runs if r], before, asyncio.run(read_engine_ttft(metrics)))
                entry[f"c{c}"] = {**summary(runs, wall, opts.max_tokens), **split}
                print(f"[chunk_timing] {name} c{c}: {json.dumps(entry[f'c{c}'])}", file=sys.stderr, flush=True)
        entry["load_average_end"] = round(os.getloadavg()[0], 2)
        result["servers"][name] = entry
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
