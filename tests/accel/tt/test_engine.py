"""TTMeshEngine end to end on the scripted mesh model (exact expected tokens, fast)."""

from __future__ import annotations

import asyncio

import pytest

from accel.contract import ConfigError, Engine, FinishReason, GenerateRequest, SamplingParams
from accel.tt.scripted_model import ScriptedMeshModel, expected_tokens
from accel.tt.step_plan import StepMode
from tests.accel.tt.engine_harness import (
    assert_lane_rules,
    assert_pool_full,
    greedy,
    make_engine,
    prompt_of,
    run_requests,
    tokens_of,
)

VOCAB = 1024


def test_40_staggered_requests_4_lanes_exact_and_lane_rules(tiny_llama):
    engine = make_engine(tiny_llama)
    try:
        chunk = engine.config.max_num_batched_tokens
        lengths = [1 + (i * 7) % (3 * chunk) for i in range(40)]
        reqs = [GenerateRequest(f"r{i}", prompt_of(i, n), greedy(12 + i % 5)) for i, n in enumerate(lengths)]
        outs = run_requests(engine, reqs, stagger_s=0.002)
        for r in reqs:
            assert tokens_of(outs[r.request_id]) == expected_tokens(r.prompt_token_ids, r.sampling.max_tokens, VOCAB)
            assert outs[r.request_id][-1].finish_reason is FinishReason.LENGTH
        assert_lane_rules(engine)
        modes = {rec.mode for rec in engine.step_log}
        assert modes == {StepMode.PREFILL, StepMode.DECODE}
        assert engine.core.queue.num_overlapped_steps > 0
        assert engine.model.num_prefill_calls + engine.model.num_decode_calls == len(engine.step_log)
        assert_pool_full(engine)
        extra = engine.extra_stats()
        assert extra.num_prefill_steps + extra.num_decode_steps == len(engine.step_log)
        # host only for prefill batches holding an intermediate chunk (device RNG must not advance)
        num_sampled = extra.num_device_sampled_tokens + extra.num_host_sampled_tokens
        assert num_sampled == sum(r.sampling.max_tokens for r in reqs)
        assert extra.num_device_sampled_tokens > 10 * extra.num_host_sampled_tokens
        assert 0 < extra.async_overlap_fraction <= 1
        assert extra.lane_occupancy == (0.0,) * 4
    finally:
        engine.close()


def test_kv_pressure_forces_decode_retry_and_preemption_still_exact(tiny_llama):
    engine = make_engine(
        tiny_llama,
        data_parallel_size=2,
        max_num_seqs=4,
        block_size=8,
        max_model_len=128,
        num_gpu_blocks_override=20,
        max_num_batched_tokens=64,
    )
    try:
        reqs = [GenerateRequest(f"p{i}", prompt_of(i, 20 + (i * 13) % 40), greedy(40)) for i in range(16)]
        outs = run_requests(engine, reqs, stagger_s=0.001)
        for r in reqs:
            assert tokens_of(outs[r.request_id]) == expected_tokens(r.prompt_token_ids, 40, VOCAB)
        assert any(rec.is_decode_retry for rec in engine.step_log), "no zero-token prefill retry"
        assert any(rec.preempted_req_ids for rec in engine.step_log), "no preemption"
        assert_lane_rules(engine)
        assert_pool_full(engine)
    finally:
        engine.close()


def test_repeated_prefix_hits_the_cache_with_identical_tokens(tiny_llama):
    engine = make_engine(tiny_llama, data_parallel_size=1, async_scheduling=False)
    try:
        prompt = prompt_of(1, 70)
        first = run_requests(engine, [GenerateRequest("a", prompt, greedy(8))])["a"]
        events = engine.take_kv_events()
        assert events and events[0].kind == "stored" and events[0].lane == 0
        second = run_requests(engine, [GenerateRequest("b", prompt, greedy(8))])["b"]
        assert tokens_of(first) == tokens_of(second) == expected_tokens(prompt, 8, VOCAB)
        computed = {}
        for rec in engine.step_log:
            for rid, _, n in rec.lane_rows[0]:
                if rec.mode is StepMode.PREFILL:
                    computed[rid] = computed.get(rid, 0) + n
        assert computed["a"] == 70 and computed["b"] == 70 - 64  # 4 blocks of 16 from the cache
        assert second[-1].num_cached_tokens == 64
        stats = engine.stats()
        assert stats.prefix_cache_hits == 64 and stats.prefix_cache_queries == 140
    finally:
        engine.close()


def test_host_fallback_exactly_for_batches_that_need_it(tiny_llama):
    engine = make_engine(tiny_llama, data_parallel_size=2, max_num_seqs=2, async_scheduling=False)
    try:
        reqs = [
            GenerateRequest("plain0", prompt_of(0, 10), greedy(6)),
            GenerateRequest("lp", prompt_of(1, 12), greedy(3, logprobs=2)),
            GenerateRequest("plain1", prompt_of(2, 9), greedy(10)),
            GenerateRequest("pen", prompt_of(3, 5), greedy(2, presence_penalty=0.5)),
        ]
        outs = run_requests(engine, reqs, stagger_s=0.01)
        for r in reqs:
            assert tokens_of(outs[r.request_id]) == expected_tokens(r.prompt_token_ids, r.sampling.max_tokens, VOCAB)
        lps = [lp for d in outs["lp"] for lp in (d.logprobs or ())]
        assert len(lps) == 3 and all(len(lp.top) == 2 and lp.top[0][0] == lp.token_id for lp in lps)
        needs_host = {"lp", "pen"}
        seen = set()
        for rec in engine.step_log:
            ids = {rid for rows in rec.lane_rows for rid, _, _ in rows}
            seen |= ids
            assert rec.is_device_sampled == (not ids & needs_host), rec
        assert {"lp", "pen", "plain0", "plain1"} <= seen
        assert any(rec.is_device_sampled for rec in engine.step_log)
    finally:
        engine.close()


@pytest.mark.parametrize("host", [False, True])
def test_seeded_sampling_reproduces(tiny_llama, host):
    engine = make_engine(tiny_llama, data_parallel_size=2, max_num_seqs=2)
    extra = {"logprobs": 0} if host else {}
    try:

        def seeded(rid):
            return GenerateRequest(
                rid, prompt_of(5, 9), SamplingParams(temperature=1.0, seed=42, max_tokens=12, ignore_eos=True, **extra)
            )

        alone = tokens_of(run_requests(engine, [seeded("s1")])["s1"])
        crowd = [
            GenerateRequest(f"c{i}", prompt_of(i, 4 + i), SamplingParams(temperature=1.0, max_tokens=9))
            for i in range(3)
        ]
        together = run_requests(engine, crowd + [seeded("s2")], stagger_s=0.001)
        assert tokens_of(together["s2"]) == alone
        assert alone != expected_tokens(prompt_of(5, 9), 12, VOCAB)  # really sampled
    finally:
        engine.close()


def test_abort_and_disconnect_free_every_block(tiny_llama):
    engine = make_engine(tiny_llama, data_parallel_size=2, max_num_seqs=2)
    try:

        async def main():
            got = []
            async for d in engine.generate(GenerateRequest("x", prompt_of(0, 30), greedy(200))):
                got.append(d)
                if len(got) == 3:
                    await engine.abort("x")
            gen = engine.generate(GenerateRequest("y", prompt_of(1, 30), greedy(200)))
            await gen.__anext__()
            await gen.aclose()  # the client went away
            return got

        got = asyncio.run(main())
        assert got[-1].finish_reason is FinishReason.ABORT
        assert all(d.finish_reason is None for d in got[:-1])
        assert_pool_full(engine)
        # The engine keeps serving afterwards.
        out = run_requests(engine, [GenerateRequest("z", prompt_of(2, 5), greedy(4))])["z"]
        assert tokens_of(out) == expected_tokens(prompt_of(2, 5), 4, VOCAB)
    finally:
        engine.close()


def test_stop_tokens_and_eos_use_the_shared_output_builder(tiny_llama):
    engine = make_engine(tiny_llama, data_parallel_size=1)
    try:
        prompt = prompt_of(3, 7)
        ref = expected_tokens(prompt, 10, VOCAB)
        sp = SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[ref[4]])
        out = run_requests(engine, [GenerateRequest("s", prompt, sp)])["s"]
        assert tokens_of(out) == ref[:5]
        assert out[-1].finish_reason is FinishReason.STOP and out[-1].stop_reason == ref[4]
        assert_pool_full(engine)
    finally:
        engine.close()


def test_stats_platform_and_api(tiny_llama):
    engine = make_engine(tiny_llama, data_parallel_size=2, max_num_seqs=3)
    try:
        assert isinstance(engine, Engine)
        stats = engine.stats()
        assert stats.platform == "tt-torch-cpu"
        assert stats.num_kv_blocks_total == 2 * engine.num_blocks_per_lane
        assert engine.max_model_len == 256 and engine.block_size == 16
        assert engine.model.warmup_calls == [("prefill", False), ("decode", False), ("prefill", True), ("decode", True)]
        asyncio.run(engine.check_health())
    finally:
        asyncio.run(engine.shutdown())
    with pytest.raises(RuntimeError, match="step loop is not running"):
        asyncio.run(engine.check_health())


def test_warmup_follows_trace_mode(tiny_llama):
    engine = make_engine(tiny_llama, data_parallel_size=1, tt={"trace_mode": "decode_only"})
    try:
        assert engine.model.warmup_calls == [("prefill", False), ("decode", False), ("decode", True)]
    finally:
        engine.close()
    engine = make_engine(tiny_llama, data_parallel_size=1, tt={"enable_model_warmup": False})
    try:
        assert engine.model.warmup_calls == []
    finally:
        engine.close()


class NoCapabilitiesModel(ScriptedMeshModel):
    model_capabilities = {}


def test_capability_refusals_at_construction(tiny_llama):
    with pytest.raises(ConfigError, match="enable_prefix_caching: the model does not declare"):
        make_engine(tiny_llama, model_class=NoCapabilitiesModel, enable_prefix_caching=True, async_scheduling=False)
    with pytest.raises(ConfigError, match="async_scheduling: the model does not declare"):
        make_engine(tiny_llama, model_class=NoCapabilitiesModel, async_scheduling=True)
    engine = make_engine(tiny_llama, model_class=NoCapabilitiesModel, async_scheduling=False, data_parallel_size=1)
    try:
        assert not engine.enable_prefix_caching  # default follows the model
        prompt = prompt_of(0, 5)
        out = run_requests(engine, [GenerateRequest("a", prompt, greedy(3))])["a"]
        assert tokens_of(out) == expected_tokens(prompt, 3, VOCAB)
        assert all(rec.is_device_sampled is False for rec in engine.step_log)  # model can't sample
    finally:
        engine.close()
