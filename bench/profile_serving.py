"""Where the CPU goes on the serving path: ``python bench/profile_serving.py --server ours``.

Starts one server of ``bench/serving_servers.py`` (``bare``, ``rayllm`` or ``ours``), warms it
up, then drives it with the same vLLM benchmark client as ``bench/serve_overhead.py`` while
``py-spy record`` samples every process of the server (proxy, ingress, router, engine replica,
vLLM engine core, ...; ``--gil`` off, ``--idle`` off, so samples are on-CPU Python time). Writes
one collapsed-stack file per process into ``--log-dir`` and prints ONE JSON object: per process,
CPU microseconds per streamed token (psutil, over the same run) and the functions with the
most self samples (the leaf frame) and the most inclusive samples.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.process_cpu import CpuSampler, process_label  # noqa: E402
from bench.serving_rounds import run_client  # noqa: E402
from bench.serving_servers import (  # noqa: E402
    bare_vllm_command,
    base_env,
    config_args,
    free_port,
    serve_command,
    server_env,
    started,
    stop_servers_on_sigterm,
    vllm_engine_args,
)
from deployments.config.load import load_app_config  # noqa: E402

PY_SPY = Path(sys.executable).with_name("py-spy")


def _frame(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``file.py:func``."""
    name, _, where = frame.partition(" (")
    return f"{Path(where.split(':')[0]).name}:{name}" if where else name


def top_functions(collapsed: Path, n: int) -> dict[str, object]:
    self_counts: collections.Counter[str] = collections.Counter()
    incl_counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text(errors="replace").splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        frames = [
            _frame(f) for f in stack.split(";") if f and not f.startswith("process ") and not f.startswith("thread ")
        ]
        if not frames:
            continue
        total += count
        self_counts[frames[-1]] += count
        for f in set(frames):
            incl_counts[f] += count
    pct = lambda c: round(100 * c / max(1, total), 1)  # noqa: E731
    return {
        "samples": total,
        "self_pct": {k: pct(v) for k, v in self_counts.most_common(n)},
        "inclusive_pct": {k: pct(v) for k, v in incl_counts.most_common(n)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=("bare", "rayllm", "ours"), default="ours")
    parser.add_argument(
        "--config", type=Path, default=Path(__file__).resolve().parents[1] / "configs" / "vllm_cpu.yaml"
    )
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rate", type=int, default=97, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--ray-env", choices=("throughput", "haproxy", "default"), default="throughput")
    parser.add_argument("--mode", default="vllm", help=argparse.SUPPRESS)
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/meshserve-profile"))
    opts = parser.parse_args()
    stop_servers_on_sigterm()
    opts.config = opts.config.resolve()
    opts.log_dir.mkdir(parents=True, exist_ok=True)
    env = base_env(opts)
    port = free_port()
    if opts.server == "ours":  # any config: a TT-only one has no vLLM engine args to read
        opts.tokenizer = str(load_app_config(config_args(opts.config)).models[0].path)
        cmd = serve_command(opts.server, opts.config, port)
    else:
        engine_args = vllm_engine_args(opts.config)
        opts.tokenizer = engine_args["model"]
        bare = opts.server == "bare"
        cmd = bare_vllm_command(engine_args, port) if bare else serve_command(opts.server, opts.config, port)
    log = open(opts.log_dir / "client.log", "w")
    with started(opts.server, cmd, server_env(env), port, opts.log_dir) as server:
        run_client(server.url, opts, opts.concurrency, 32, 1, log)  # warm-up
        spies = []
        for p in server.cpu_processes():
            with contextlib.suppress(Exception):
                label = process_label(p.cmdline(), p.name())
                out = opts.log_dir / f"{label}-{p.pid}.txt"
                spy = [str(PY_SPY), "record", "--pid", str(p.pid), "--rate", str(opts.rate), "--format", "raw"]
                spy += ["--output", str(out), "--nonblocking", "--threads"]
                spies.append(
                    (label, p.pid, out, subprocess.Popen(spy, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                )
        time.sleep(2)
        sampler = CpuSampler(server)
        sampler.start()
        result = run_client(server.url, opts, opts.concurrency, opts.num_prompts, 7, log)
        cpu = sampler.stop(result["total_output_tokens"])
        for *_rest, proc in spies:
            proc.send_signal(2)  # SIGINT: py-spy writes its output and exits
        for *_rest, proc in spies:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
    report = {
        "server": opts.server,
        "concurrency": opts.concurrency,
        "output_tok_s": round(result["output_throughput"], 1),
        "tokens": result["total_output_tokens"],
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpu_us_per_token": cpu,
        "processes": {},
    }
    for label, pid, out, _proc in spies:
        if out.exists() and out.stat().st_size:
            report["processes"][f"{label}-{pid}"] = top_functions(out, opts.top)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
