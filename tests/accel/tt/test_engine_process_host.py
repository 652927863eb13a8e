"""``TTMeshEngine.in_engine_process`` (``EngineProcessHost``): the real TT engine (torch mesh model
on CPU) with its step loop in an engine process of its own — same outputs as HF, abort frees KV,
KV events and snapshots cross the pipe, structured outputs compile in the engine process, a dead
engine process fails its streams and health."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from accel.contract import FinishReason, GenerateRequest, InvalidRequestError, SamplingParams, StructuredOutputSpec
from accel.tt.config import TTEngineConfig
from accel.tt.engine import TTMeshEngine
from accel.tt.health import EngineUnhealthy
from tests.hf_reference import hf_greedy


def _config(ckpt, **args) -> TTEngineConfig:
    engine_args = {"model": str(ckpt), "max_num_seqs": 2, "data_parallel_size": 2, "block_size": 16}
    engine_args.update(max_model_len=256, **args)
    return TTEngineConfig.from_engine_args(engine_args)


@pytest.fixture(scope="module")
def engine(tiny_llama):
    engine = TTMeshEngine.in_engine_process(_config(tiny_llama), step_timeout_s=30)
    yield engine
    engine.close()


def _greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw)


async def _collect(engine, request):
    return [d async for d in engine.generate(request)]


def test_concurrent_greedy_streams_equal_hf(engine, tiny_llama):
    prompts = [(0, 5, 6, 7), (0, 9, 10), (0, 11, 12, 13, 14), (0, 3)]

    async def run():
        reqs = [GenerateRequest(f"g{i}", p, _greedy(12, logprobs=0)) for i, p in enumerate(prompts)]
        return await asyncio.gather(*[_collect(engine, r) for r in reqs])

    for prompt, deltas in zip(prompts, asyncio.run(run())):
        ids = [t for d in deltas for t in d.new_token_ids]
        assert ids == hf_greedy(tiny_llama, list(prompt), 12)
        assert [lp.token_id for d in deltas for lp in d.logprobs] == ids
        assert deltas[-1].finish_reason is FinishReason.LENGTH
        assert "".join(d.text for d in deltas)  # detokenized on this side
    assert engine.num_busy_iterations > 0 and engine.host_busy_s > 0  # the core's figures came across
    assert engine.stats().num_running == 0


def test_the_core_runs_one_torch_thread_unless_omp_num_threads_says_otherwise(engine):
    assert engine.torch_threads == int(os.environ.get("OMP_NUM_THREADS", "1"))


def test_leaving_a_stream_aborts_it_in_the_core_and_frees_its_blocks(engine):
    async def run():
        free_before = engine.stats().num_kv_blocks_free
        stream = engine.generate(GenerateRequest("a1", tuple(range(1, 41)), _greedy(200)))
        await anext(stream)
        await anext(stream)
        assert engine.stats().num_running == 1
        await stream.aclose()
        for _ in range(100):
            if engine.stats().num_running == 0:
                break
            await asyncio.sleep(0.01)
        stats = engine.stats()
        assert stats.num_running == 0 and stats.num_kv_blocks_free == free_before

    asyncio.run(run())


def test_kv_events_and_the_block_snapshot_come_from_the_core(engine):
    engine.take_kv_events()

    async def run():
        await _collect(engine, GenerateRequest("kv1", tuple(range(100, 150)), _greedy(2)))

    asyncio.run(run())
    stored = [h for e in engine.take_kv_events() if e.kind == "stored" for h in e.block_hashes]
    assert len(stored) >= 3  # 50 prompt tokens: three full 16-token blocks
    assert set(stored) <= set(engine.kv_block_snapshot())


def test_structured_outputs_compile_in_the_core(engine):
    spec = StructuredOutputSpec(choice=["yes", "no"])

    async def run():
        deltas = await _collect(
            engine,
            GenerateRequest("s1", (0, 5, 6), SamplingParams(temperature=0, max_tokens=8, structured_outputs=spec)),
        )
        with pytest.raises(InvalidRequestError):
            bad = StructuredOutputSpec(json="{not json")
            await _collect(
                engine, GenerateRequest("s2", (0, 5, 6), SamplingParams(max_tokens=4, structured_outputs=bad))
            )
        return deltas

    deltas = asyncio.run(run())
    assert "".join(d.text for d in deltas) in ("yes", "no")


def test_a_dead_core_fails_open_streams_and_health(tiny_llama):
    engine = TTMeshEngine.in_engine_process(_config(tiny_llama), step_timeout_s=30)

    async def run():
        await engine.check_health()
        stream = engine.generate(GenerateRequest("d1", (0, 5), _greedy(240)))
        await anext(stream)
        os.kill(engine.host.process.pid, signal.SIGKILL)
        with pytest.raises(EngineUnhealthy, match="engine-core process exited"):
            async for _ in stream:
                pass
        with pytest.raises(EngineUnhealthy):
            await engine.check_health()
        with pytest.raises(RuntimeError):
            await _collect(engine, GenerateRequest("d2", (0, 5), _greedy(2)))

    asyncio.run(run())
    engine.close()


def test_shutdown_stops_the_core(tiny_llama):
    engine = TTMeshEngine.in_engine_process(_config(tiny_llama), step_timeout_s=30)
    asyncio.run(engine.shutdown())
    assert not engine.host.process.is_alive()
    with pytest.raises(EngineUnhealthy, match="shut down"):
        asyncio.run(engine.check_health())


def test_a_build_error_in_the_core_is_raised_by_the_constructor(tiny_llama):
    """Accelerator tt without a mesh here: the core process cannot open the device and says why."""
    from accel.tt.model_setup import open_default_backend

    try:
        open_default_backend(_config(tiny_llama), "tt")
    except Exception as exc:
        expected = type(exc).__name__
    else:
        pytest.skip("a TT mesh opens on this machine")
    with pytest.raises(RuntimeError, match=expected):
        TTMeshEngine.in_engine_process(_config(tiny_llama), step_timeout_s=30, accelerator="tt")
