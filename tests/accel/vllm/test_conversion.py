import dataclasses
from types import SimpleNamespace

from accel.contract import FinishReason, KVTransferParams, SamplingParams, StructuredOutputSpec
from accel.vllm.conversion import (
    from_vllm_kv_params,
    to_finish_reason,
    to_prompt_logprobs,
    to_token_logprobs,
    to_vllm_kv_params,
    to_vllm_sampling_params,
)


def test_every_contract_field_reaches_vllm():
    sp = SamplingParams(
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        seed=11,
        max_tokens=33,
        min_tokens=2,
        stop=["\n\n"],
        stop_token_ids=[7, 9],
        include_stop_str_in_output=True,
        ignore_eos=True,
        logprobs=4,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.2,
        logit_bias={"5": -3.0},
        skip_special_tokens=False,
        prompt_logprobs=3,
        structured_outputs=StructuredOutputSpec(json={"type": "object"}, disable_any_whitespace=True),
        allowed_token_ids=[1, 5, 9],
        bad_words=["foo", "bar baz"],
        bad_words_token_ids=[[3], [4, 5]],
    )
    v = to_vllm_sampling_params(sp)
    # bad_words go as words (vLLM tokenizes them itself: update_from_tokenizer)
    matched_by_output_builder = {"stop", "include_stop_str_in_output", "bad_words_token_ids"}
    for f in dataclasses.fields(SamplingParams):
        if f.name in matched_by_output_builder:
            continue
        ours = getattr(sp, f.name)
        theirs = getattr(v, f.name)
        if f.name == "logit_bias":
            assert theirs == {5: -3.0}
        elif f.name == "stop_token_ids":
            assert theirs == [7, 9]
        elif f.name in ("allowed_token_ids", "bad_words"):
            assert theirs == list(ours), f.name
        elif f.name == "structured_outputs":
            assert theirs.json == '{"type": "object"}' and theirs.disable_any_whitespace
            assert theirs.regex is None and theirs.choice is None and theirs.json_object is None
        else:
            assert theirs == ours, f.name
    from vllm.sampling_params import RequestOutputKind

    assert v.output_kind == RequestOutputKind.DELTA and v.detokenize is False
    assert not v.stop  # stop strings are ours


def test_logprobs_mapping():
    lp = lambda logprob, rank: SimpleNamespace(logprob=logprob, rank=rank)  # noqa: E731
    # token 9 sampled at rank 3 (outside top-2); top-2 are 4 and 6
    out = to_token_logprobs(
        [9, 4], [{9: lp(-3.0, 3), 4: lp(-0.5, 1), 6: lp(-1.0, 2)}, {4: lp(-0.1, 1), 2: lp(-2.5, 2)}], num_top=2
    )
    assert out[0].token_id == 9 and out[0].logprob == -3.0 and out[0].top == ((4, -0.5), (6, -1.0))
    assert out[1].top == ((4, -0.1), (2, -2.5))
    assert to_token_logprobs([1], None, 2) is None


def test_prompt_logprobs_mapping():
    from vllm.logprobs import Logprob

    # vLLM: None for the first prompt token, then {token: Logprob} with the token and its top-k
    raw = [None, {8: Logprob(-2.0, 4), 3: Logprob(-0.2, 1)}, {5: Logprob(-0.7, 1)}]
    out = to_prompt_logprobs([1, 8, 5], raw, 1)
    assert out[0] is None
    assert (out[1].token_id, out[1].logprob, out[1].rank, out[1].top) == (8, -2.0, 4, ((3, -0.2),))
    assert (out[2].token_id, out[2].rank, out[2].top) == (5, 1, ((5, -0.7),))
    assert to_prompt_logprobs([1], None, 1) is None


def test_finish_reasons():
    assert to_finish_reason("stop") is FinishReason.STOP
    assert to_finish_reason("length") is FinishReason.LENGTH
    assert to_finish_reason("abort") is FinishReason.ABORT
    assert to_finish_reason(None) is FinishReason.ABORT


def test_kv_transfer_params_ours_or_the_engine_connectors_unchanged():
    ours = KVTransferParams(do_remote_prefill=True, transfer_id="t", num_tokens=96)
    assert to_vllm_kv_params(ours) == {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "transfer_id": "t",
        "num_tokens": 96,
    }
    assert from_vllm_kv_params(to_vllm_kv_params(ours), None) == ours
    nixl = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    native = KVTransferParams(do_remote_decode=True, transfer_id="t", connector_params=nixl)
    assert to_vllm_kv_params(native) == nixl  # our transfer id stays on our side
    tpu = {"uuid": 99, "remote_host": "10.0.0.7", "remote_port": 9100}
    assert from_vllm_kv_params(tpu, native) == KVTransferParams(connector_params=tpu)
    assert from_vllm_kv_params(None, native) is None and from_vllm_kv_params({}, ours) is None


def test_each_structured_output_kind_reaches_vllm():
    from vllm.sampling_params import StructuredOutputsParams

    for kwargs in ({"regex": "a+"}, {"choice": ["x", "y"]}, {"grammar": 'root ::= "a"'}, {"json_object": True}):
        v = to_vllm_sampling_params(SamplingParams(structured_outputs=StructuredOutputSpec(**kwargs)))
        assert isinstance(v.structured_outputs, StructuredOutputsParams)
        ((key, value),) = kwargs.items()
        assert getattr(v.structured_outputs, key) == (list(value) if key == "choice" else value)
    assert to_vllm_sampling_params(SamplingParams()).structured_outputs is None
