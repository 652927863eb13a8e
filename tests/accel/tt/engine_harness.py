"""Shared helpers for TT engine tests: build an engine, run staggered requests, check lane rules."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from accel.contract import GenerateRequest, OutputDelta, SamplingParams
from accel.tt.config import TTEngineConfig
from accel.tt.engine import TTMeshEngine
from accel.tt.engine_core import lanes_of
from accel.tt.scripted_model import ScriptedMeshModel
from accel.tt.step_plan import StepMode


def make_engine(ckpt: Path, model_class: type = ScriptedMeshModel, tt: dict | None = None, **args: Any) -> TTMeshEngine:
    engine_args = dict(
        model=str(ckpt),
        max_num_seqs=4,
        data_parallel_size=4,
        block_size=16,
        max_model_len=256,
        max_num_batched_tokens=32,
        async_scheduling=True,
        additional_config={"tt": {"sample_on_device_mode": "all", **(tt or {})}},
    )
    engine_args.update(args)
    return TTMeshEngine(TTEngineConfig.from_engine_args(engine_args), model_class=model_class, keep_step_log=True)


def greedy(max_tokens: int, **kw: Any) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kw)


def prompt_of(i: int, length: int) -> tuple[int, ...]:
    return tuple(3 + (i * 37 + j * 11) % 1000 for j in range(length))


async def collect(engine: TTMeshEngine, request: GenerateRequest, delay_s: float = 0.0) -> list[OutputDelta]:
    if delay_s:
        await asyncio.sleep(delay_s)
    return [d async for d in engine.generate(request)]


def run_requests(
    engine: TTMeshEngine, requests: list[GenerateRequest], stagger_s: float = 0.0
) -> dict[str, list[OutputDelta]]:
    async def main():
        outs = await asyncio.gather(*[collect(engine, r, i * stagger_s) for i, r in enumerate(requests)])
        return {r.request_id: o for r, o in zip(requests, outs)}

    return asyncio.run(main())


def tokens_of(deltas: list[OutputDelta]) -> list[int]:
    return [t for d in deltas for t in d.new_token_ids]


def assert_lane_rules(engine: TTMeshEngine) -> None:
    """Every step homogeneous, one dispatch, per-lane rows within capacity, static lanes."""
    per_lane = engine.config.max_num_seqs
    assert engine.step_log, "no step ran"
    for rec in engine.step_log:
        assert rec.num_dispatches == 1, rec
        assert rec.mode in (StepMode.PREFILL, StepMode.DECODE)
        for lane, rows in enumerate(rec.lane_rows):
            assert len(rows) <= per_lane
            for _, row, num_tokens in rows:
                assert row // per_lane == lane
                if rec.mode is StepMode.DECODE:
                    assert num_tokens == 1
    for req_id, lanes in lanes_of(engine.step_log).items():
        assert len(lanes) == 1, f"{req_id} moved between lanes {lanes}"


def assert_pool_full(engine: TTMeshEngine) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the snapshot is published right after the last delta
        stats = engine.stats()
        if stats.num_running == 0 and stats.num_kv_blocks_free == stats.num_kv_blocks_total:
            break
        time.sleep(0.005)
    assert stats.num_running == 0 and stats.num_waiting == 0
    assert stats.num_kv_blocks_free == stats.num_kv_blocks_total
