"""vLLM's own benchmark client against one server, and the measured rounds of
``bench/serve_overhead.py`` / ``bench/profile_serving.py``.

``run_client`` drives a server with ``vllm.benchmarks.serve`` exactly as ``vllm bench serve``
does (called from Python: the console script is broken) and returns the client's own figures.
``measure`` is one measured run: the client, plus each server process's CPU per streamed token
(``bench/process_cpu.py``) and how late an idle process beside the client woke up
(``bench/sched_stall.py``). ``run_rounds`` alternates the servers round by round and
``summarize_server`` takes the medians.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import statistics
import sys
import time
from collections.abc import Mapping
from typing import Any

from bench.process_cpu import CpuSampler
from bench.sched_stall import StallProbe
from bench.serving_servers import SERVED_MODEL, Server

CLIENT_KEYS = (
    "completed",
    "total_output_tokens",
    "duration",
    "output_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "median_itl_ms",
    "p99_itl_ms",
)
# The endpoints the client can drive: name -> (its --backend, its --endpoint).
ENDPOINTS = {"completions": ("openai", "/v1/completions"), "chat": ("openai-chat", "/v1/chat/completions")}
WARMUP_PROMPTS = 32

# -- the client ---------------------------------------------------------------------------------


def parse_num_prompts(text: str, concurrency: list[int]) -> dict[int, int]:
    """``--num-prompts``: one count for every concurrency (``"128"``), or one per concurrency in
    ``--concurrency``'s order (``"4,32,64"`` for ``1,16,64``)."""
    counts = [int(n) for n in text.split(",") if n]
    if len(counts) == 1:
        counts *= len(concurrency)
    if len(counts) != len(concurrency) or min(counts) < 1:
        raise ValueError(f"--num-prompts {text!r}: one count, or one per concurrency {concurrency}")
    return dict(zip(concurrency, counts))


def prompts_for(opts, concurrency: int) -> int:
    """The measured prompts at ``concurrency`` (``opts.prompts_by_concurrency`` when set)."""
    per = getattr(opts, "prompts_by_concurrency", None)
    return per[concurrency] if per else opts.num_prompts


def client_args(url: str, opts, concurrency: int, num_prompts: int, seed: int):
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    backend, endpoint = ENDPOINTS[getattr(opts, "endpoint", "completions")]
    served = getattr(opts, "served_model", SERVED_MODEL)
    argv = ["--backend", backend, "--base-url", url, "--endpoint", endpoint]
    argv += ["--model", opts.tokenizer, "--served-model-name", served, "--tokenizer", opts.tokenizer]
    argv += ["--dataset-name", "random", "--random-input-len", str(opts.input_len)]
    argv += ["--random-output-len", str(opts.output_len), "--num-prompts", str(num_prompts), "--ignore-eos"]
    argv += ["--max-concurrency", str(concurrency), "--seed", str(seed), "--disable-tqdm"]
    argv += ["--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,90,99"]
    argv += ["--ready-check-timeout-sec", "0"]
    if opts.mode == "tt":
        argv += ["--header", "x-meshserve-pool=tt"]
    return parser.parse_args(argv)


def run_client(url: str, opts, concurrency: int, num_prompts: int, seed: int, log: io.TextIOBase) -> dict[str, Any]:
    from vllm.benchmarks.serve import main_async

    args = client_args(url, opts, concurrency, num_prompts, seed)
    with contextlib.redirect_stdout(log):
        result = asyncio.run(main_async(args))
    out = {k: int(result[k]) if k in ("completed", "total_output_tokens") else float(result[k]) for k in CLIENT_KEYS}
    if out["completed"] != num_prompts:
        raise RuntimeError(f"{url}: {out['completed']} of {num_prompts} requests completed (see {log.name})")
    return out


# -- rounds -------------------------------------------------------------------------------------


def measure(server: Server, opts, concurrency: int, seed: int, log) -> dict[str, Any]:
    sampler = CpuSampler(server)
    stall = StallProbe()
    own = time.process_time()
    sampler.start()
    stall.start()
    try:
        result = run_client(server.url, opts, concurrency, prompts_for(opts, concurrency), seed, log)
    finally:
        stall_ms = stall.stop()
    result["sched_stall_ms"] = stall_ms
    result["cpu_us_per_token"] = sampler.stop(result["total_output_tokens"])
    result["cpu_us_per_token"]["client"] = round(
        1e6 * (time.process_time() - own) / max(1, result["total_output_tokens"]), 1
    )
    return result


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 2)


def summarize_server(runs: list[dict[str, Any]]) -> dict[str, Any]:
    cpu_labels = sorted({k for r in runs for k in r["cpu_us_per_token"]})
    return {
        "output_tok_s": median_of(runs, "output_throughput"),
        "ttft_p50_ms": median_of(runs, "median_ttft_ms"),
        "tpot_p50_ms": median_of(runs, "median_tpot_ms"),
        "itl_p99_ms": median_of(runs, "p99_itl_ms"),
        "rounds_tok_s": [round(r["output_throughput"], 1) for r in runs],
        # How late an idle process on the machine woke up during each round (bench/sched_stall.py).
        "sched_stall_p99_ms": [r["sched_stall_ms"]["p99_ms"] for r in runs if "sched_stall_ms" in r],
        "sched_stall_max_ms": [r["sched_stall_ms"]["max_ms"] for r in runs if "sched_stall_ms" in r],
        "tokens_per_round": [r["total_output_tokens"] for r in runs],
        "cpu_us_per_token": {
            k: round(statistics.median(r["cpu_us_per_token"].get(k, 0.0) for r in runs), 1) for k in cpu_labels
        },
    }


def loop_ms(iterations: int = 2_000_000, repeats: int = 3) -> float:
    """How fast this host runs Python now: the best of ``repeats`` timings of a fixed loop, in ms.
    The same host has read bare vLLM at 1,000 and at 2,600 tok/s on different hours (a shared
    VM); this says which kind of hour a run had, so runs are compared by ratios within a run."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        total = 0
        for i in range(iterations):
            total += i
        best = min(best, time.perf_counter() - t0)
    return round(1e3 * best, 1)


class LoadWatch:
    """The load average at the start and end of a run and its 1-minute peak between runs, and
    ``loop_ms`` before the servers start and after they stop."""

    def __init__(self) -> None:
        self.start = [round(x, 2) for x in os.getloadavg()]
        self.max_1min = self.start[0]
        self.loop_ms_start = loop_ms()

    def note(self) -> None:
        self.max_1min = max(self.max_1min, round(os.getloadavg()[0], 2))

    def report(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": [round(x, 2) for x in os.getloadavg()],
            "max_1min": self.max_1min,
            "loop_ms": [self.loop_ms_start, loop_ms()],
        }


def run_rounds(runners: Mapping[str, Any], opts, load: LoadWatch) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """``runners``: name -> callable(concurrency, seed) -> one measurement. Rounds alternate
    the runners, rotated each round; every runner gets the same seed within a round."""
    names = list(runners)
    for name in names:  # warm-up (compile, caches, connection pools), not measured; its runner
        # sends min(WARMUP_PROMPTS, the first concurrency's prompts)
        runners[name](opts.concurrency[0], 1, warmup=True)
    out: dict[int, dict[str, list[dict[str, Any]]]] = {c: {n: [] for n in names} for c in opts.concurrency}
    for i in range(opts.rounds):
        order = names[i % len(names) :] + names[: i % len(names)]
        for c in opts.concurrency:
            for name in order:
                load.note()
                out[c][name].append(runners[name](c, 100 + i))
                print(
                    f"round {i} c={c} {name}: {out[c][name][-1]['output_throughput']:.1f} tok/s",
                    file=sys.stderr,
                    flush=True,
                )
    return out


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("nan")
