"""TTMeshEngine refusing and failing on the scripted mesh model: invalid requests, a failed step,
a failed inbox message, a duplicate request id; each fails alone and the engine goes on."""

from __future__ import annotations

import asyncio

import pytest

from accel.contract import FinishReason, GenerateRequest, InvalidRequestError, KVTransferParams, SamplingParams
from accel.tt.config import TTEngineConfig
from accel.tt.engine import TTMeshEngine
from accel.tt.scripted_model import ScriptedMeshModel, expected_tokens
from tests.accel.tt.engine_harness import (
    assert_pool_full,
    collect,
    greedy,
    make_engine,
    prompt_of,
    run_requests,
    tokens_of,
)

VOCAB = 1024


def test_invalid_requests_raise_and_engine_survives(tiny_llama):
    engine = make_engine(tiny_llama, data_parallel_size=1, max_model_len=64)
    try:

        async def first(req):
            return await collect(engine, req)

        with pytest.raises(InvalidRequestError) as info:
            asyncio.run(first(GenerateRequest("long", prompt_of(0, 64), greedy(4))))
        assert info.value.field == "prompt" and "max_model_len is 64" in info.value.message
        with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
            asyncio.run(first(GenerateRequest("vocab", (5, 5000), greedy(4))))
        with pytest.raises(InvalidRequestError) as info:  # no kv_hooks attached
            asyncio.run(
                first(GenerateRequest("kv", (5, 6), greedy(1), kv_transfer=KVTransferParams(do_remote_decode=True)))
            )
        assert info.value.field == "kv_transfer_params"
        with pytest.raises(InvalidRequestError) as info:  # no prompt-logprob path on TT
            asyncio.run(first(GenerateRequest("plp", (5, 6), SamplingParams(max_tokens=1, prompt_logprobs=1))))
        assert info.value.field == "prompt_logprobs"
        # max_model_len ends generation: 60 + 4 = 64
        out = run_requests(engine, [GenerateRequest("edge", prompt_of(0, 60), greedy(100))])["edge"]
        assert len(tokens_of(out)) == 4 and out[-1].finish_reason is FinishReason.LENGTH
    finally:
        engine.close()


class FailingOnceModel(ScriptedMeshModel):
    """Raises on its 3rd decode, like a device op failing mid-run."""

    def decode_forward(self, **kw):
        if self.num_decode_calls == 2:
            self.num_decode_calls += 1
            raise RuntimeError("device fault")
        return super().decode_forward(**kw)


def test_a_failed_step_fails_its_requests_frees_blocks_and_the_engine_survives(tiny_llama):
    engine = make_engine(tiny_llama, model_class=FailingOnceModel, data_parallel_size=1)
    try:
        with pytest.raises(RuntimeError, match="TT mesh engine step failed: device fault"):
            run_requests(engine, [GenerateRequest("a", prompt_of(0, 5), greedy(10))])
        assert_pool_full(engine)
        out = run_requests(engine, [GenerateRequest("b", prompt_of(1, 5), greedy(5))])["b"]
        assert tokens_of(out) == expected_tokens(prompt_of(1, 5), 5, VOCAB)
    finally:
        engine.close()


class RefusingImportHooks:
    """KV hooks whose import for request "bad" raises (say, the KV actor is gone)."""

    async def prefetch(self, request):
        pass

    def may_import(self, r):
        return True

    def on_added(self, r, pool, lane_kv):
        if r.req_id == "bad":
            raise RuntimeError("actor gone")

    def on_finished(self, r, lane_kv):
        return None


def test_a_failed_inbox_message_fails_only_its_request(tiny_llama):
    """An ``AddRequest`` whose handling raises (here: the KV import hook) reaches that request's
    consumer as its error and leaves nothing behind; the engine keeps serving."""
    config = TTEngineConfig.from_engine_args(
        dict(model=str(tiny_llama), max_num_seqs=2, block_size=16, max_model_len=256, max_num_batched_tokens=32)
    )
    engine = TTMeshEngine(config, model_class=ScriptedMeshModel, kv_hooks=RefusingImportHooks())
    try:
        with pytest.raises(RuntimeError, match="TT mesh engine could not add bad: actor gone"):
            run_requests(engine, [GenerateRequest("bad", prompt_of(0, 5), greedy(4))])
        assert not engine.core.requests
        assert_pool_full(engine)
        out = run_requests(engine, [GenerateRequest("good", prompt_of(1, 5), greedy(4))])["good"]
        assert tokens_of(out) == expected_tokens(prompt_of(1, 5), 4, VOCAB)
    finally:
        engine.close()


def test_duplicate_running_request_id_is_refused(tiny_llama):
    engine = make_engine(tiny_llama, data_parallel_size=1)
    try:

        async def main():
            first = engine.generate(GenerateRequest("same", prompt_of(0, 5), greedy(50)))
            await first.__anext__()
            with pytest.raises(InvalidRequestError, match="already running"):
                await engine.generate(GenerateRequest("same", prompt_of(1, 5), greedy(2))).__anext__()
            rest = [d async for d in first]
            return rest

        rest = asyncio.run(main())
        assert rest[-1].finish_reason is FinishReason.LENGTH
        assert_pool_full(engine)
    finally:
        engine.close()
