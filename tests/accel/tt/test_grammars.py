"""A failover continuation's grammar resumes where the stream stopped (``Grammars.constraint``
advances it over ``resumed_output_token_ids``): greedy structured output resumed after k tokens
equals the uninterrupted run, for every structured-output kind, on the TT engine."""

from __future__ import annotations

import dataclasses

import pytest

from accel.contract import FinishReason, GenerateRequest, SamplingParams
from accel.text.tokenizer import load_tokenizer
from tests.accel.structured.cases import CASES, Case

MAX_MODEL_LEN = 512
PROMPT = "The answer is"


@pytest.fixture(scope="module")
def tt_engine(tiny_llama):
    from accel.tt.torch_model import TorchMeshModel
    from tests.accel.tt.engine_harness import make_engine

    engine = make_engine(
        tiny_llama, model_class=TorchMeshModel, tt={"enable_model_warmup": False}, max_model_len=MAX_MODEL_LEN
    )
    yield engine
    engine.close()


def _run(loop, engine, request: GenerateRequest) -> tuple[list[int], FinishReason | None]:
    async def run():
        return [d async for d in engine.generate(request)]

    deltas = loop.run_until_complete(run())
    return [t for d in deltas for t in d.new_token_ids], deltas[-1].finish_reason


def _continuation(request: GenerateRequest, sent: list[int], resume: bool) -> GenerateRequest:
    """What ``serve_app.http.failover.StreamProgress.continuation`` sends after ``sent``."""
    sp = request.sampling
    assert sp.max_tokens is not None
    return dataclasses.replace(
        request,
        request_id=f"{request.request_id}#failover1",
        prompt_token_ids=request.prompt_token_ids + tuple(sent),
        resumed_output_token_ids=tuple(sent) if resume else (),
        sampling=dataclasses.replace(sp, max_tokens=sp.max_tokens - len(sent)),
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_resumed_greedy_structured_output_equals_the_uninterrupted_run(loop, tt_engine, tiny_llama, case: Case):
    tok = load_tokenizer(str(tiny_llama))
    request = GenerateRequest(
        f"g-{case.name}",
        tuple(tok.encode(PROMPT)),
        SamplingParams(temperature=0.0, max_tokens=48, structured_outputs=case.spec),
    )
    full, finish = _run(loop, tt_engine, request)
    assert finish is FinishReason.STOP and case.valid(tok.decode(full)), (case.name, tok.decode(full))
    assert len(full) >= 3, full  # room to stop mid-way
    for k in sorted({1, len(full) // 2, len(full) - 1}):
        rest, finish = _run(loop, tt_engine, _continuation(request, full[:k], resume=True))
        assert full[:k] + rest == full, (case.name, k)
        assert finish is FinishReason.STOP


def test_without_resumed_tokens_the_grammar_restarts(loop, tt_engine, tiny_llama):
    """Why the field exists: the same continuation without it restarts the grammar, and the JSON
    output no longer equals (nor, here, parses as) the uninterrupted one."""
    case = CASES[0]  # json_schema
    tok = load_tokenizer(str(tiny_llama))
    request = GenerateRequest(
        "g-restart",
        tuple(tok.encode(PROMPT)),
        SamplingParams(temperature=0.0, max_tokens=48, structured_outputs=case.spec),
    )
    full, _ = _run(loop, tt_engine, request)
    k = len(full) // 2
    rest, _ = _run(loop, tt_engine, _continuation(request, full[:k], resume=False))
    assert full[:k] + rest != full


def test_resumed_tokens_must_end_the_prompt():
    from accel.contract import InvalidRequestError

    GenerateRequest("ok", (1, 2, 3), resumed_output_token_ids=(2, 3))
    for prompt, resumed in (((1, 2, 3), (2,)), ((1, 2), (1, 2))):
        with pytest.raises(InvalidRequestError):
            GenerateRequest("bad", prompt, resumed_output_token_ids=resumed)
