"""StreamProgress: the continuation request and the rewriting of its deltas."""

from __future__ import annotations

from accel.contract import FinishReason, GenerateRequest, KVTransferParams, OutputDelta, SamplingParams
from deployments.ingress.failover import StreamProgress


def test_continuation_and_budget_end():
    req = GenerateRequest(
        "q",
        (5, 6),
        SamplingParams(max_tokens=2, seed=7),
        kv_transfer=KVTransferParams(do_remote_prefill=True, transfer_id="t"),
    )
    progress = StreamProgress(req)
    assert not progress.started
    progress.pass_on(OutputDelta("q", (1,), "a", 2, 1))
    cont = progress.continuation(1)
    assert cont.prompt_token_ids == (5, 6, 1) and cont.sampling.max_tokens == 1 and cont.sampling.seed == 7
    assert cont.kv_transfer is None and cont.request_id == "q#failover1"
    progress.pass_on(OutputDelta("q#failover1", (2,), "b", 3, 1))
    assert progress.continuation(2) is None  # budget spent: the stream ends with length
    end = progress.length_end()
    assert end.finish_reason == FinishReason.LENGTH and end.num_completion_tokens == 2 and end.num_prompt_tokens == 2
