"""What our serving stack costs an engine, under vLLM's own benchmark client.

``python bench/serve_overhead.py`` (mode ``vllm``, the default) starts, each in its own process
group and all at once (``bench/serving_servers.py``):

- ``bare``: vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``);
- ``rayllm``: Ray Serve LLM 2.60 (``ray.serve.llm.build_openai_app``) around the same engine;
- ``ours``: ``--config`` (default ``configs/vllm_cpu.yaml``) through our whole stack;
- ``ours_own`` (only when named in ``--servers``): the same with every pool in its own deployment
  (``placement: own``), to weigh ``placement: ingress`` in the same run (``ours_over_ours_own``);
- ``ours_direct`` (only when named): the same server as ``ours``, its client on the ingress
  replica's own HTTP port (Serve's direct ingress) instead of the app's port, where HAProxy (or
  Serve's proxy) fronts it; its figures are ``ours``'s keys prefixed ``direct_``;
- ``<server>@NAME=VALUE[@...]``: that server with environment overrides (a Ray or HAProxy
  setting weighed against the default in the same run);

with the same vllm-cpu engine args (those of the config's vLLM pool), the two Ray servers with
the same Ray settings (``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``, Ray workers at nice 0 as the bare
server runs, unless ``--ray-env default``). Each is then driven by ``vllm.benchmarks.serve`` (the
``vllm bench serve`` client, called from Python: the console script is broken) exactly as a user
would: ``--backend openai --dataset-name random --random-input-len 128 --random-output-len 128
--num-prompts 128 --ignore-eos --max-concurrency C`` for each C of ``--concurrency`` (16 and 64),
in ``--rounds`` rounds that alternate the servers (order rotated each round, a new prompt seed
per round, the same seed for every server in a round), after one warm-up run per server.
``--endpoints chat`` (or ``completions,chat``) drives the chat endpoint too, with the client's
``openai-chat`` backend (``/v1/chat/completions``; the prompt goes through the model's chat
template on every server), in rounds of its own after the completions ones; its results are
keyed ``chat_c<C>`` beside ``c<C>``. ``--num-prompts`` takes one count per concurrency
(``4,32,64`` for ``--concurrency 1,16,64``) where a real model makes C=1 slow. Every server
serves the config's model under its own name (``smollm2-135m-instruct`` with
``configs/vllm_cpu_smollm2.yaml``). ``--goals issue37`` judges the real model's goals (>= 0.95x
bare throughput, TTFT p50 <= 1.10x bare's, >= 1.7x Ray Serve LLM) instead of issue 11's.
Tokens are the client's own counts (the usage it reads from the stream), not requests x
max_tokens. During every measured run the CPU time of each process of each server is sampled
(psutil), giving CPU microseconds per streamed token per process (``cpu_us_per_token``).

``--mode tt`` drives the TT pool the same way (header ``x-meshserve-pool: tt``, ``--config``
default ``configs/tt_cpu.yaml``: one TT replica) against the same TT engine (built from the
same pool config) driven in this process with the same load: C concurrent requests of the same
prompt and output lengths, ignore_eos; the ratio is stack / in-process output tokens per second.

Prints ONE JSON object (medians over rounds; ``load_average`` = ``os.getloadavg()`` at start and
end, its 1-minute maximum seen between runs, and ``loop_ms``: how long a fixed Python loop took
before the servers started and after they stopped, the host's speed that hour). Run it alone:
``flock /tmp/meshserve-heavy.lock python bench/serve_overhead.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.engine_driver import drive_engine  # noqa: E402
from bench.serving_rounds import (  # noqa: E402
    ENDPOINTS,
    WARMUP_PROMPTS,
    LoadWatch,
    measure,
    parse_num_prompts,
    prompts_for,
    ratio,
    run_client,
    run_rounds,
    summarize_server,
)
from bench.serving_servers import (  # noqa: E402
    REPO,
    Server,
    bare_vllm_command,
    base_env,
    config_args,
    default_ray_env,
    direct_port_env,
    free_port,
    serve_command,
    served_model_name,
    server_env,
    started,
    stop_servers_on_sigterm,
    vllm_engine_args,
)
from deployments.config.load import load_app_config  # noqa: E402

# Goals per issue (--goals): a lower bound, or an upper one for the keys in UPPER_BOUNDS.
GOAL_SETS = {
    # Issue 11, the tiny model.
    "issue11": {
        "ours_over_bare": 0.9,
        "ours_over_rayllm": 1.7,
        "ours_over_rayllm_default": 1.7,
        "added_ttft_p50_ms": 15.0,
        "ours_itl_p99_ms": 30.0,
    },
    # Issue 37, the real model: >= 0.95x bare throughput, TTFT p50 within 10 % of bare's,
    # >= 1.7x Ray Serve LLM.
    "issue37": {
        "ours_over_bare": 0.95,
        "ttft_p50_over_bare": 1.10,
        "ours_over_rayllm": 1.7,
        "ours_over_rayllm_default": 1.7,
    },
}
GOALS = GOAL_SETS["issue11"]
UPPER_BOUNDS = ("added_ttft_p50_ms", "ttft_p50_over_bare", "ours_itl_p99_ms")


def vllm_mode(opts, env: dict[str, str], load: LoadWatch) -> dict[str, Any]:
    engine_args = vllm_engine_args(opts.config)
    opts.tokenizer = engine_args["model"]
    opts.served_model = served_model_name(opts.config)
    servers: dict[str, Server] = {}
    failed: dict[str, str] = {}
    log = open(opts.log_dir / "client.log", "w")
    with contextlib.ExitStack() as stack:
        for name in opts.servers:
            port = free_port()
            # `ours@KEY=VALUE@...`: a variant of a server with environment overrides (a Ray or
            # HAProxy setting weighed against the default in the same run).
            kind, *overrides = name.split("@")
            own_env = {**server_env(env), **dict(o.split("=", 1) for o in overrides)}
            if kind == "bare":
                cmd = bare_vllm_command(engine_args, port, opts.served_model)
            elif kind == "rayllm_default":
                cmd, own_env = serve_command("rayllm", opts.config, port), default_ray_env(env)
            elif kind == "ours_direct":
                # The same server as `ours`, its client on the ingress replica's own HTTP port
                # (direct ingress) instead of the app's port (HAProxy or Serve's proxy in front).
                cmd, port = serve_command("ours", opts.config, port), free_port()
                own_env.update(direct_port_env(port))
            else:
                cmd = serve_command(kind, opts.config, port)
            if name in opts.unpin:  # vLLM-CPU's model worker not pinned to core 0 (its default: "auto")
                own_env = {**own_env, "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
            try:
                servers[name] = stack.enter_context(
                    started(
                        name, cmd, own_env, port, opts.log_dir, new_session=opts.new_session, model=opts.served_model
                    )
                )
            except (RuntimeError, TimeoutError) as exc:  # (stopped already) measure the others
                failed[name] = str(exc)[-2000:]
                print(f"{name} did not start: {exc}", file=sys.stderr)

        def runner(server: Server):
            def run(c: int, seed: int, warmup: bool = False) -> dict[str, Any]:
                if warmup:
                    return run_client(server.url, opts, c, min(WARMUP_PROMPTS, prompts_for(opts, c)), seed, log)
                return measure(server, opts, c, seed, log)

            return run

        runs = {}
        for endpoint in opts.endpoints:  # one endpoint after the other, each with its warm-up
            opts.endpoint = endpoint
            runs[endpoint] = run_rounds({n: runner(s) for n, s in servers.items()}, opts, load)
    result: dict[str, Any] = {"failed_to_start": failed} if failed else {}
    for endpoint, per_c in runs.items():
        for c, per_server in per_c.items():
            summary = {name: summarize_server(r) for name, r in per_server.items()}
            entry: dict[str, Any] = {"servers": summary}
            for label in ("ours", "ours_direct"):
                entry.update(compared(label, summary))
            entry["meets"] = goals_met(entry, GOAL_SETS[opts.goals])
            result[result_key(endpoint, c)] = entry
    return result


def result_key(endpoint: str, concurrency: int) -> str:
    """``c16`` for the completions endpoint (the key of every earlier run), ``chat_c16`` for chat."""
    return f"c{concurrency}" if endpoint == "completions" else f"{endpoint}_c{concurrency}"


def compared(label: str, summary: dict[str, Any]) -> dict[str, Any]:
    """``label``'s figures against the peers measured in the same run; ``ours_direct``'s keys are
    ``ours``'s prefixed with ``direct_``."""
    ours = summary.get(label)
    if not ours:
        return {}
    out: dict[str, Any] = {}
    if "bare" in summary:
        out["ours_over_bare"] = ratio(ours["output_tok_s"], summary["bare"]["output_tok_s"])
        out["added_ttft_p50_ms"] = round(ours["ttft_p50_ms"] - summary["bare"]["ttft_p50_ms"], 2)
        out["ttft_p50_over_bare"] = ratio(ours["ttft_p50_ms"], summary["bare"]["ttft_p50_ms"])
    if "rayllm" in summary:
        out["ours_over_rayllm"] = ratio(ours["output_tok_s"], summary["rayllm"]["output_tok_s"])
    if "rayllm_default" in summary:
        # The comparison: Ray Serve LLM with Ray's defaults (no throughput mode/HAProxy).
        out["ours_over_rayllm_default"] = ratio(ours["output_tok_s"], summary["rayllm_default"]["output_tok_s"])
    if "ours_own" in summary and label == "ours":
        # placement as configured vs every pool in its own deployment, same run.
        out["ours_over_ours_own"] = ratio(ours["output_tok_s"], summary["ours_own"]["output_tok_s"])
    out["ours_itl_p99_ms"] = ours["itl_p99_ms"]
    return {f"direct_{k}" if label == "ours_direct" else k: v for k, v in out.items()}


def goals_met(entry: dict[str, Any], goals: dict[str, float] = GOALS) -> dict[str, bool]:
    """Each figure of ``entry`` that ``goals`` (issue 11's by default) sets a goal for
    (``direct_`` ones too): met or not."""
    met = {}
    for key, value in entry.items():
        goal = key.removeprefix("direct_")
        if goal in goals:
            upper = goal in UPPER_BOUNDS
            met[key] = bool(value <= goals[goal] if upper else value >= goals[goal])
    return met


# -- TT mode: the stack vs the same engine in this process --------------------------------------


def tt_mode(opts, env: dict[str, str], load: LoadWatch) -> dict[str, Any]:
    from deployments.replicas.tt_replica import make_tt_engine

    app = load_app_config(config_args(opts.config))
    pool = next(p for p in app.pools if p.engine == "tt")
    model = next(m for m in app.models if m.name == pool.model)
    threads = served_torch_threads(app, pool)
    opts.tokenizer = str(model.path)
    opts.served_model = model.name
    log = open(opts.log_dir / "client.log", "w")
    loop = asyncio.new_event_loop()
    with contextlib.ExitStack() as stack:
        port = free_port()
        cmd = serve_command("ours", opts.config, port)
        server = stack.enter_context(
            started("ours", cmd, server_env(env), port, opts.log_dir, new_session=opts.new_session, model=model.name)
        )
        engine = make_tt_engine(pool)  # (an engine-core process inherits OMP_NUM_THREADS from here)
        stack.callback(lambda: loop.run_until_complete(engine.shutdown()))

        core_pid = getattr(engine, "engine_process_pid", None)  # a TT engine process of its own (None: none)

        def in_process(c: int, seed: int, warmup: bool = False) -> dict[str, Any]:
            own, core = time.process_time(), _cpu_s(core_pid)
            n = min(WARMUP_PROMPTS, prompts_for(opts, c)) if warmup else prompts_for(opts, c)
            result = loop.run_until_complete(drive_engine(engine, c, n, opts, seed))
            tokens = result["total_output_tokens"]
            result["cpu_us_per_token"] = {"in_process": round(1e6 * (time.process_time() - own) / tokens, 1)}
            if core_pid is not None:
                result["cpu_us_per_token"]["engine_core"] = round(1e6 * (_cpu_s(core_pid) - core) / tokens, 1)
            return result

        def through_stack(c: int, seed: int, warmup: bool = False) -> dict[str, Any]:
            if warmup:
                return run_client(server.url, opts, c, min(WARMUP_PROMPTS, prompts_for(opts, c)), seed, log)
            return measure(server, opts, c, seed, log)

        runs = run_rounds({"ours": through_stack, "in_process": in_process}, opts, load)
    loop.close()
    result: dict[str, Any] = {"torch_threads": threads}
    for c, per in runs.items():
        summary = {name: summarize_server(r) for name, r in per.items()}
        r = ratio(summary["ours"]["output_tok_s"], summary["in_process"]["output_tok_s"])
        result[f"c{c}"] = {
            "servers": summary,
            "ours_over_in_process": r,
            "meets": {"ours_over_in_process": bool(r >= 0.9)},
        }
    return result


def served_torch_threads(app: Any, pool: Any) -> int:
    """Give the in-process engine the thread budget the served one has, and return it.

    The served engine runs in a Ray worker (the pool's replica, or the ingress replica with
    ``placement: ingress``), where Ray sets ``OMP_NUM_THREADS`` = max(floor(num_cpus), 1) unless it
    is set already (``ray._private.utils.set_omp_num_threads_if_unset``); torch there, and in an
    engine-core process it spawns, uses that many intra-op threads. Without this the in-process
    engine would get torch's default (every core) and the ratio would compare thread budgets."""
    import math

    import torch

    num_cpus = pool.num_cpus + (app.ingress.num_cpus if pool.placement == "ingress" else 0)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(math.floor(num_cpus), 1)))
    threads = int(os.environ["OMP_NUM_THREADS"])
    torch.set_num_threads(threads)
    return threads


def _cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 for None)."""
    if pid is None:
        return 0.0
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


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
    parser.add_argument(
        "--num-prompts", default="128", help="prompts per run: one count, or one per --concurrency value"
    )
    parser.add_argument(
        "--endpoints",
        default="completions",
        help="vllm mode: completions, chat (the client's openai-chat backend) or both, comma-separated",
    )
    parser.add_argument("--goals", choices=sorted(GOAL_SETS), default="issue11", help="which issue's goals")
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
    parser.add_argument(
        "--new-session",
        action="store_true",
        help="start each server in a session of its own (setsid), as before 3 Dec: on an autogroup kernel "
        "vLLM's busy-polling engine then starves the client (bench/process_group.py)",
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
    if opts.ray_env == "default" and any(s.startswith("ours_direct") for s in opts.servers):
        # Serve starts a replica's own HTTP server only in throughput mode or with HAProxy.
        raise SystemExit("ours_direct needs Serve's direct ingress: --ray-env throughput or haproxy")
    opts.concurrency = [int(c) for c in opts.concurrency.split(",")]
    opts.prompts_by_concurrency = parse_num_prompts(opts.num_prompts, opts.concurrency)
    opts.endpoints = [e for e in opts.endpoints.split(",") if e]
    unknown = set(opts.endpoints) - set(ENDPOINTS)
    if unknown or (opts.mode == "tt" and opts.endpoints != ["completions"]):
        raise SystemExit(f"--endpoints: {sorted(unknown) or opts.endpoints} (vllm mode: {sorted(ENDPOINTS)})")
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
            "args": f"--dataset-name random --random-input-len {opts.input_len} "
            f"--random-output-len {opts.output_len} --ignore-eos",
            "backends": {e: ENDPOINTS[e][0] for e in opts.endpoints},
            "num_prompts": {f"c{c}": n for c, n in opts.prompts_by_concurrency.items()},
            "concurrency": opts.concurrency,
            "rounds": opts.rounds,
        },
        "served_model": opts.served_model,
        "goals": GOAL_SETS[opts.goals],
        "ray_env": opts.ray_env,
        "unpinned": sorted(opts.unpin),
        "server_session": "own" if opts.new_session else "the client's",
        "load_average": load.report(),
        **body,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
