"""TTMeshEngine with TorchMeshModel: greedy output token-exact against HF transformers."""

from __future__ import annotations

import pytest
import torch

from accel.contract import GenerateRequest, SamplingParams
from accel.tt.step_plan import StepMode
from accel.tt.torch_model import TorchMeshModel
from tests.accel.tt.engine_harness import (
    assert_lane_rules,
    assert_pool_full,
    greedy,
    make_engine,
    prompt_of,
    run_requests,
    tokens_of,
)
from tests.hf_reference import hf_greedy, hf_logprobs

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def assert_matches_hf(ckpt, reqs, outs):
    for r in reqs:
        ref = hf_greedy(ckpt, r.prompt_token_ids, r.sampling.max_tokens)
        assert tokens_of(outs[r.request_id]) == ref, r.request_id


@pytest.mark.parametrize("ckpt_name", ["tiny_llama", "tiny_qwen3"])
def test_40_staggered_requests_4x4_lanes_token_exact(request, ckpt_name):
    ckpt = request.getfixturevalue(ckpt_name)
    engine = make_engine(ckpt, model_class=TorchMeshModel, tt={"enable_model_warmup": False})
    try:
        chunk = engine.config.max_num_batched_tokens
        # The last four arrivals decode 20 tokens together after every other request is done: a
        # steady tail (same rows, no prefill between) that async decode must overlap on any
        # machine; the staggered head alone changes layout almost every step.
        reqs = [
            GenerateRequest(f"r{i}", prompt_of(i, 1 + (i * 7) % (3 * chunk)), greedy(6 + i % 4 if i < 36 else 20))
            for i in range(40)
        ]
        outs = run_requests(engine, reqs, stagger_s=0.003)
        assert_matches_hf(ckpt, reqs, outs)
        assert_lane_rules(engine)
        assert {rec.mode for rec in engine.step_log} == {StepMode.PREFILL, StepMode.DECODE}
        prefill_rows: dict[str, int] = {}
        for rec in engine.step_log:
            if rec.mode is StepMode.PREFILL:
                for rows in rec.lane_rows:
                    for rid, _, _ in rows:
                        prefill_rows[rid] = prefill_rows.get(rid, 0) + 1
        assert max(prefill_rows.values()) >= 3  # prompts up to 3x the chunk were chunked
        assert engine.core.queue.num_overlapped_steps > 0
        assert_pool_full(engine)
    finally:
        engine.close()


def test_kv_pressure_preemption_and_retry_token_exact(tiny_llama):
    engine = make_engine(
        tiny_llama,
        model_class=TorchMeshModel,
        data_parallel_size=2,
        max_num_seqs=4,
        block_size=8,
        max_model_len=128,
        num_gpu_blocks_override=20,
        max_num_batched_tokens=64,
        tt={"enable_model_warmup": False},
    )
    try:
        reqs = [GenerateRequest(f"p{i}", prompt_of(i, 20 + (i * 13) % 40), greedy(24)) for i in range(12)]
        outs = run_requests(engine, reqs, stagger_s=0.002)
        assert_matches_hf(tiny_llama, reqs, outs)
        assert any(rec.is_decode_retry for rec in engine.step_log)
        assert any(rec.preempted_req_ids for rec in engine.step_log)
        assert_lane_rules(engine)
        assert_pool_full(engine)
    finally:
        engine.close()


def test_prefix_cache_hit_and_host_sampling_token_exact(tiny_qwen3):
    engine = make_engine(
        tiny_qwen3,
        model_class=TorchMeshModel,
        data_parallel_size=1,
        async_scheduling=False,
        tt={"enable_model_warmup": False, "sample_on_device_mode": None},
    )
    try:
        prompt = prompt_of(9, 50)
        a = run_requests(engine, [GenerateRequest("a", prompt, greedy(8))])
        b = run_requests(engine, [GenerateRequest("b", prompt, greedy(8))])
        assert_matches_hf(tiny_qwen3, [GenerateRequest("a", prompt, greedy(8))], a)
        assert tokens_of(b["b"]) == tokens_of(a["a"])
        assert b["b"][-1].num_cached_tokens == 48
        assert all(rec.is_device_sampled is False for rec in engine.step_log)
        prefill_tokens = [
            n
            for rec in engine.step_log
            if rec.mode is StepMode.PREFILL
            for rows in rec.lane_rows
            for rid, _, n in rows
            if rid == "b"
        ]
        assert sum(prefill_tokens) == 2
    finally:
        engine.close()


def test_seeded_sampling_reproduces_on_device_and_host(tiny_llama):
    engine = make_engine(
        tiny_llama, model_class=TorchMeshModel, data_parallel_size=2, max_num_seqs=2, tt={"enable_model_warmup": False}
    )
    try:

        def seeded(rid, **extra):
            # top_k <= 32: the device sampler takes it; logprobs sends the batch to the host
            return GenerateRequest(
                rid,
                prompt_of(3, 12),
                SamplingParams(temperature=1.0, top_k=20, seed=7, max_tokens=10, ignore_eos=True, **extra),
            )

        crowd = [
            GenerateRequest(f"c{i}", prompt_of(i, 5 + i), SamplingParams(temperature=0.9, top_k=10, max_tokens=8))
            for i in range(3)
        ]
        device_alone = tokens_of(run_requests(engine, [seeded("d1")])["d1"])
        device_crowd = tokens_of(run_requests(engine, crowd + [seeded("d2")], stagger_s=0.002)["d2"])
        host_alone = tokens_of(run_requests(engine, [seeded("h1", logprobs=0)])["h1"])
        host_crowd = tokens_of(run_requests(engine, [seeded("h2", logprobs=0)] + crowd[:1])["h2"])
        assert device_alone == device_crowd and host_alone == host_crowd
        assert device_alone != hf_greedy(tiny_llama, prompt_of(3, 12), 10)  # really sampled
        assert {rec.is_device_sampled for rec in engine.step_log} == {True, False}
    finally:
        engine.close()


def test_logprob_values_match_hf(tiny_llama):
    # Pins the values, not just their shape: the host path must score the raw logits of the right position.
    engine = make_engine(
        tiny_llama, model_class=TorchMeshModel, data_parallel_size=1, max_num_seqs=2, tt={"enable_model_warmup": False}
    )
    try:
        req = GenerateRequest("lpv", prompt_of(4, 11), greedy(4, logprobs=3))
        lps = [lp for d in run_requests(engine, [req])["lpv"] for lp in (d.logprobs or ())]
    finally:
        engine.close()
    ref = hf_logprobs(tiny_llama, req.prompt_token_ids, [lp.token_id for lp in lps], num_top=3)
    assert len(lps) == 4
    for lp, (value, top_ids) in zip(lps, ref):
        assert lp.logprob == pytest.approx(value, abs=1e-3)
        assert [t for t, _ in lp.top] == top_ids
