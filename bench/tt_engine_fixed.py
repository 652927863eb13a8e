"""``bench/tt_engine.py``'s first part: the 128-row decode on a mesh model of fixed device time
(``ScriptedMeshModel`` on a virtual device clock), for the overlap efficiency and the host cost
per step (see that script's docstring for the keys), and the helpers both parts drive engines
with."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from pathlib import Path
from typing import Any

from accel.contract import GenerateRequest, SamplingParams
from accel.tt.config import TTEngineConfig
from accel.tt.engine import TTMeshEngine
from accel.tt.engine_parts import build_engine_parts
from accel.tt.request_state import RequestState
from accel.tt.scripted_model import ScriptedMeshModel

DECODE_TIME_S = 0.010
LANES, PER_LANE = 4, 32


class FixedTimeMeshModel(ScriptedMeshModel):
    """A fixed device time per decode step; the "device" thread does (almost) no Python work, so
    the host measurements are not polluted by a fake device holding the GIL."""

    decode_time_s = DECODE_TIME_S
    computes_decode = False


class ZeroTimeMeshModel(FixedTimeMeshModel):
    """The same virtual device, done as soon as a step is submitted (nothing to wait for)."""

    decode_time_s = 0.0


def random_prompts(n: int, length: int, seed: int) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    return [tuple(rng.randrange(3, 1000) for _ in range(length)) for _ in range(n)]


async def run_timed(engine, requests, on_delta=None) -> tuple[list[float], list[float], list[float]]:
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
                on_delta(i, counts[i], d.finished)

    await asyncio.gather(*[one(i, r) for i, r in enumerate(requests)])
    return first, last, arrivals


def _fixed_config(ckpt: Path, async_scheduling: bool) -> TTEngineConfig:
    return TTEngineConfig.from_engine_args(
        dict(
            model=str(ckpt),
            max_num_seqs=PER_LANE,
            data_parallel_size=LANES,
            block_size=64,
            max_model_len=512,
            max_num_batched_tokens=2048,
            async_scheduling=async_scheduling,
            additional_config={"tt": {"sample_on_device_mode": "all", "enable_model_warmup": False}},
        )
    )


def fixed_time_decode(ckpt: Path, async_scheduling: bool, max_tokens: int, repeats: int, process: bool = False) -> dict:
    """Median over ``repeats`` rounds of a full 128-row decode (same engine, fresh requests).
    ``process``: the step loop in an engine process of its own (``TTMeshEngine.in_engine_process``, as
    ``configs/tt_cpu.yaml`` serves it), so it shares no GIL with this process's consumer; its
    host time then includes pickling each step's outputs to this process."""
    config = _fixed_config(ckpt, async_scheduling)
    if process:
        engine: Any = TTMeshEngine.in_engine_process(config, model_class=FixedTimeMeshModel, accelerator="cpu")
    else:
        engine = TTMeshEngine(config, model_class=FixedTimeMeshModel)
    try:
        rounds = [_decode_round(engine, round_id, max_tokens) for round_id in range(repeats)]
    finally:
        engine.close()
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


def _decode_round(engine: Any, round_id: int, max_tokens: int) -> dict:
    """Steady-decode window: from the moment every request decodes to the first finish."""
    prompts = random_prompts(LANES * PER_LANE, 16, seed=round_id)
    reqs = [
        GenerateRequest(f"d{round_id}-{i}", p, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
        for i, p in enumerate(prompts)
    ]
    marks: dict[str, tuple[float, float, int]] = {}
    decoding: set[int] = set()

    def mark(name: str) -> None:  # counters at the window edges; runs on the asyncio thread
        marks.setdefault(name, (time.thread_time(), engine.host_busy_s, engine.num_busy_iterations))

    def on_delta(i: int, num_tokens_so_far: int, finished: bool) -> None:
        if num_tokens_so_far >= 2 and i not in decoding:
            decoding.add(i)
            if len(decoding) == len(reqs):
                mark("start")
        if finished:
            mark("end")

    first, last, arrivals = asyncio.run(run_timed(engine, reqs, on_delta))
    t0, t1 = max(first), min(last)
    achieved = sum(1 for t in arrivals if t0 < t <= t1) / (t1 - t0)
    ideal = LANES * PER_LANE / DECODE_TIME_S
    (c0, h0, n0), (c1, h1, n1) = marks["start"], marks["end"]
    steps = max(n1 - n0, 1)
    return {
        "efficiency": achieved / ideal,
        "tok_s": achieved,
        "ideal_tok_s": ideal,
        "host_ms_per_step": 1000 * (h1 - h0) / steps,
        "consumer_ms_per_step": 1000 * (c1 - c0) / steps,
    }


def churn_decode(ckpt: Path, async_scheduling: bool, num_requests: int, seed: int = 0) -> dict:
    """Serving-like churn on the same 128-slot fixed-time mesh: a closed loop keeps 128 streams
    open, each with its own length (``max_tokens`` uniform in 32..160), so requests join and
    leave the decode batch every few steps. Achieved / ideal output tokens per second over the
    window from the first moment all 128 are open to the last request's submission, and the
    share of decode steps that overlapped the host's work (``async_overlap_fraction``), and the
    p50 / p99 gap between a stream's consecutive tokens in that window. Prefill
    takes no device time here: the figure isolates what a join or a leave costs the decode."""
    config = _fixed_config(ckpt, async_scheduling)
    engine = TTMeshEngine(config, model_class=FixedTimeMeshModel)
    rng = random.Random(seed)
    slots = LANES * PER_LANE
    prompts = random_prompts(num_requests, 16, seed=seed)
    lengths = [rng.randint(32, 160) for _ in range(num_requests)]
    arrivals: list[float] = []
    gaps_ms: list[float] = []  # between a stream's consecutive tokens, inside the window
    window: dict[str, float] = {}

    async def main() -> None:
        next_id = 0
        open_streams = 0

        async def stream(i: int) -> None:
            params = SamplingParams(temperature=0, max_tokens=lengths[i], ignore_eos=True)
            last = None
            async for d in engine.generate(GenerateRequest(f"c{seed}-{i}", prompts[i], params)):
                if not d.new_token_ids:
                    continue
                now = time.perf_counter()
                arrivals.extend([now] * len(d.new_token_ids))
                if last is not None and "start" in window and "end" not in window:
                    gaps_ms.append(1000 * (now - last))
                    gaps_ms.extend([0.0] * (len(d.new_token_ids) - 1))
                last = now

        async def worker() -> None:
            nonlocal next_id, open_streams
            while next_id < num_requests:
                i, next_id = next_id, next_id + 1
                if i == num_requests - 1:
                    window["end"] = time.perf_counter()
                open_streams += 1
                if open_streams == slots and "start" not in window:
                    window["start"] = time.perf_counter()
                await stream(i)
                open_streams -= 1

        await asyncio.gather(*[worker() for _ in range(slots)])

    try:
        asyncio.run(main())
        stats = engine.extra_stats()
    finally:
        engine.close()
    t0, t1 = window["start"], window["end"]
    achieved = sum(1 for t in arrivals if t0 < t <= t1) / (t1 - t0)
    return {
        "efficiency": achieved / (slots / DECODE_TIME_S),
        "tok_s": achieved,
        "async_overlap_fraction": stats.async_overlap_fraction,
        "itl_p50_ms": statistics.median(gaps_ms),
        "itl_p99_ms": statistics.quantiles(gaps_ms, n=100)[98],
    }


def solo_decode_step(ckpt: Path, steps: int, repeats: int, idle_s: float = 0.0) -> float:
    """CPU ms per 128-row steady decode step of the engine core alone: the same engine config and
    requests as ``fixed_time_decode``, the core stepped on this thread with a device that is done
    at once, so no thread shares the GIL. ``idle_s`` 0: steps back to back
    (``host_ms_per_step_warm``); else this thread sleeps ``idle_s`` between steps, outside the
    timed step, as the step loop waits for the mesh (``host_ms_per_step_idle``). Median over
    ``repeats`` rounds of ``steps`` steps each."""
    parts = build_engine_parts(_fixed_config(ckpt, async_scheduling=True), model_class=ZeroTimeMeshModel)
    core, per_round = parts.core, []
    try:
        for round_id in range(repeats):
            for i, prompt in enumerate(random_prompts(LANES * PER_LANE, 16, seed=round_id)):
                params = SamplingParams(temperature=0, max_tokens=steps + 8, ignore_eos=True)
                core.add_request(RequestState.new(GenerateRequest(f"w{round_id}-{i}", prompt, params)))
            first_decode = core.num_decode_steps
            while core.num_decode_steps < first_decode + 2:  # every row admitted and decoding
                core.step()
            num_rows, cpu_s = 0, 0.0
            for _ in range(steps):
                if idle_s:
                    time.sleep(idle_s)
                started_cpu_s = time.thread_time()
                num_rows += len(core.step())
                cpu_s += time.thread_time() - started_cpu_s
            assert num_rows == steps * LANES * PER_LANE, "the window must be steady 128-row decode"
            per_round.append(1000 * cpu_s / steps)
            while core.has_work():
                core.step()
    finally:
        parts.close()
    return statistics.median(per_round)
