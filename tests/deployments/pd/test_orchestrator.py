import asyncio

import pytest

from accel.contract import (
    FinishReason,
    GenerateRequest,
    KVTransferParams,
    OutputDelta,
    SamplingParams,
    StructuredOutputSpec,
    join_token_ids,
)
from deployments.pd.orchestrator import PDOrchestrator, prefill_request

REQ = GenerateRequest(
    "r1", (5, 6, 7, 8), SamplingParams(temperature=0, max_tokens=3, min_tokens=2, stop=("x",), logprobs=2)
)


def _delta(rid, tokens, finished=False, ticket=None):
    return OutputDelta(
        rid,
        tuple(tokens),
        "",
        4,
        len(tokens),
        finish_reason=FinishReason.LENGTH if finished else None,
        kv_transfer=ticket,
    )


class FakeDecode:
    def __init__(self):
        self.requests = []

    async def __call__(self, request):
        self.requests.append(request)
        yield _delta(request.request_id, [1])
        yield _delta(request.request_id, [2, 3], finished=True)


def _run(orch, prefill, decode):
    async def go():
        return [d async for d in orch.stream(REQ, prefill, decode)]

    return asyncio.run(go())


def test_prefill_request_is_clamped_and_exports():
    pre = prefill_request(REQ, "tid")
    assert pre.request_id == "r1-prefill" and pre.prompt_token_ids == REQ.prompt_token_ids
    assert pre.sampling.max_tokens == 1 and pre.sampling.min_tokens == 0 and pre.sampling.stop == ()
    assert pre.sampling.logprobs is None and pre.sampling.temperature == 0
    assert pre.kv_transfer == KVTransferParams(do_remote_decode=True, transfer_id="tid")


def test_prefill_request_carries_no_grammar():
    sp = SamplingParams(
        structured_outputs=StructuredOutputSpec(choice=["a", "b"]),
        allowed_token_ids=[1, 2],
        bad_words=["x"],
        bad_words_token_ids=[[3]],
    )
    pre = prefill_request(GenerateRequest("r2", (5, 6), sp), "tid")
    assert not pre.sampling.has_logit_constraints and pre.sampling.bad_words == ()


def test_ticket_goes_from_prefill_to_decode():
    seen = []

    async def prefill(request):
        seen.append(request)
        ticket = KVTransferParams(do_remote_prefill=True, transfer_id=request.kv_transfer.transfer_id, num_tokens=4)
        yield _delta(request.request_id, [9], finished=True, ticket=ticket)

    decode, orch = FakeDecode(), PDOrchestrator(metrics=False)
    out = _run(orch, prefill, decode)
    assert join_token_ids(out) == [1, 2, 3] and out[-1].request_id == "r1"
    sent = decode.requests[0]
    assert sent.request_id == "r1" and sent.sampling == REQ.sampling
    assert sent.kv_transfer.do_remote_prefill and sent.kv_transfer.transfer_id == seen[0].kv_transfer.transfer_id
    assert orch.num_recomputes == {}


@pytest.mark.parametrize("reason", ["prefill_failed", "no_ticket", "prefill_timeout"])
def test_any_prefill_failure_recomputes_on_decode(reason):
    async def prefill(request):
        if reason == "prefill_failed":
            raise RuntimeError("replica died")
        if reason == "prefill_timeout":
            await asyncio.sleep(10)
        yield _delta(request.request_id, [9], finished=True)  # no ticket: export failed

    decode, orch = FakeDecode(), PDOrchestrator(prefill_timeout_s=0.1, metrics=False)
    out = _run(orch, prefill, decode)
    assert join_token_ids(out) == [1, 2, 3], "the request must complete"
    assert decode.requests[0].kv_transfer is None  # decode prefills the prompt itself
    assert orch.num_recomputes == {reason: 1}
