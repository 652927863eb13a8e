"""The TT engine (``TorchMeshModel``) on the real default model, SmolLM2-135M-Instruct: greedy
output token for token equal to HF transformers with lanes, chunked prefill, device sampling and
async decode; prefix-cache hits; preemption under KV pressure.

Chat prompts are real ones rendered by the model's own template, so the logits are those of a
trained model (peaked where it is sure, close where it hesitates), not the tiny random ones.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from accel.contract import GenerateRequest
from accel.tt.step_plan import StepMode
from accel.tt.torch_model import TorchMeshModel
from tests.accel.tt.engine_harness import (
    assert_lane_rules,
    assert_pool_full,
    greedy,
    make_engine,
    run_requests,
    tokens_of,
)
from tests.hf_reference import greedy_divergence, hf_greedy

pytestmark = pytest.mark.slow

QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain gravity in one sentence.",
    "List three primary colors.",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 12?",
)
# A system prompt shared by the prefix-cache requests (~80 tokens: two full 32-token blocks).
SYSTEM = (
    "You are a careful assistant for a railway company. Answer questions about timetables, tickets, "
    "luggage, accessibility, bicycles, pets and delays. Be brief, polite and exact. If you do not know, "
    "say so and point to the help desk at the main station, open from six in the morning to ten at night. "
    "Never invent prices. Tickets bought online can be refunded up to one hour before departure. "
    "Children under six travel free. Dogs need a half-price ticket unless they fit in a carrier."
)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def chat_ids(smollm2):
    tokenizer = AutoTokenizer.from_pretrained(smollm2)

    def render(question: str, system: str | None = None) -> tuple[int, ...]:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
        return tuple(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))

    return render


def assert_greedy_equal(ckpt, reqs, outs) -> None:
    for r in reqs:
        ours = tokens_of(outs[r.request_id])
        ref = hf_greedy(ckpt, r.prompt_token_ids, r.sampling.max_tokens)
        # On a mismatch, say where and by how much HF's top two differ there (fp32 summation
        # order can flip a near-tie; a real bug shows a large margin).
        assert ours == ref, (r.request_id, greedy_divergence(ckpt, r.prompt_token_ids, ours))


def test_lanes_chunked_prefill_device_sampling_and_async_decode(smollm2, chat_ids):
    # 2 lanes x 3 seqs, 48-token prefill chunks: the prompts with the system prompt (~110
    # tokens) span three chunks, the others (~37-45) one or two.
    engine = make_engine(
        smollm2,
        model_class=TorchMeshModel,
        data_parallel_size=2,
        max_num_seqs=3,
        block_size=32,
        max_model_len=512,
        max_num_batched_tokens=48,
        tt={"enable_model_warmup": False},
    )
    try:
        reqs = [
            GenerateRequest(f"q{i}", chat_ids(q, SYSTEM if i % 2 else None), greedy(20))
            for i, q in enumerate(QUESTIONS)
        ]
        outs = run_requests(engine, reqs, stagger_s=0.01)
        assert_greedy_equal(smollm2, reqs, outs)
        log = engine.step_log
        assert any(rec.is_device_sampled for rec in log)  # the device sampler chose the tokens
        chunks: dict[str, int] = {}
        for rec in log:
            if rec.mode is StepMode.PREFILL:
                for rows in rec.lane_rows:
                    for rid, _, _ in rows:
                        chunks[rid] = chunks.get(rid, 0) + 1
        assert max(chunks.values()) >= 3  # the system-prompt requests were chunked
        assert engine.core.queue.num_overlapped_steps > 0  # async decode overlapped steps
        assert_lane_rules(engine)
        assert_pool_full(engine)
    finally:
        engine.close()


def test_prefix_cache_hit_on_a_shared_system_prompt(smollm2, chat_ids):
    engine = make_engine(
        smollm2,
        model_class=TorchMeshModel,
        data_parallel_size=1,
        max_num_seqs=2,
        block_size=32,
        max_model_len=512,
        max_num_batched_tokens=256,
        tt={"enable_model_warmup": False, "sample_on_device_mode": None},
    )
    try:
        first = GenerateRequest("first", chat_ids(QUESTIONS[3], SYSTEM), greedy(16))
        second = GenerateRequest("second", chat_ids(QUESTIONS[4], SYSTEM), greedy(16))
        outs = run_requests(engine, [first]) | run_requests(engine, [second])
        assert_greedy_equal(smollm2, [first, second], outs)
        shared = 0
        for a, b in zip(first.prompt_token_ids, second.prompt_token_ids):
            if a != b:
                break
            shared += 1
        assert shared >= 64
        assert outs["second"][-1].num_cached_tokens == shared // 32 * 32  # every full shared block hit
        assert all(rec.is_device_sampled is False for rec in engine.step_log)  # host sampling here
    finally:
        engine.close()


def test_preemption_under_kv_pressure(smollm2, chat_ids):
    # 12 blocks of 16 tokens for 6 concurrent requests of ~37-45 prompt + 32 output tokens
    # (~3-4 blocks each beyond the template's shared first block): the scheduler must preempt.
    engine = make_engine(
        smollm2,
        model_class=TorchMeshModel,
        data_parallel_size=1,
        max_num_seqs=6,
        block_size=16,
        max_model_len=128,
        num_gpu_blocks_override=12,
        max_num_batched_tokens=128,
        tt={"enable_model_warmup": False},
    )
    try:
        reqs = [GenerateRequest(f"p{i}", chat_ids(q), greedy(32)) for i, q in enumerate(QUESTIONS)]
        outs = run_requests(engine, reqs, stagger_s=0.005)
        assert_greedy_equal(smollm2, reqs, outs)
        assert any(rec.preempted_req_ids for rec in engine.step_log)
        assert_pool_full(engine)
    finally:
        engine.close()
