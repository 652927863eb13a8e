"""StreamProgress: the continuation request and the rewriting of its deltas."""

from __future__ import annotations

from accel.contract import FinishReason, GenerateRequest, KVTransferParams, OutputDelta, SamplingParams
from serve_app.http.failover import StreamProgress


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
    assert cont.resumed_output_token_ids == (1,)  # the grammar resumes over the tokens sent
    progress.pass_on(OutputDelta("q#failover1", (2,), "b", 3, 1))
    assert progress.continuation(2) is None  # budget spent: the stream ends with length
    end = progress.length_end()
    assert end.finish_reason == FinishReason.LENGTH and end.num_completion_tokens == 2 and end.num_prompt_tokens == 2


def _engine_deltas(tok, request, ids):
    """What an engine's output builder emits for ``ids`` (one token per step)."""
    from accel.text.output_builder import OutputBuilder

    builder = OutputBuilder(request, tok.fast, frozenset(), 10_000)
    out = []
    for t in ids:
        out.append(builder.add_tokens([t]))
        if builder.finished:
            break
    return out


def _run_with_failover(tok, request, ids, at):
    """Deltas the consumer sees when the replica dies after ``at`` tokens and the continuation's
    engine (which decodes without the tokens before) produces the rest."""
    progress = StreamProgress(request, tok.fast)
    seen = [progress.pass_on(d) for d in _engine_deltas(tok, request, ids[:at])]
    cont = progress.continuation(1)
    for d in _engine_deltas(tok, cont, ids[at:]):
        seen.append(progress.pass_on(d))
        if progress.finished:
            break
    return seen


def test_continuation_text_equals_the_uninterrupted_text(tiny_llama):
    from accel.text.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tiny_llama))
    ids = tok.encode("Hello world, this is a café ☕ test of the seam.", add_special_tokens=False)
    request = GenerateRequest("q", (1, 2), SamplingParams(max_tokens=len(ids), ignore_eos=True))
    reference = "".join(d.text for d in _engine_deltas(tok, request, ids))
    for at in range(1, len(ids)):
        seen = _run_with_failover(tok, request, ids, at)
        assert "".join(d.text for d in seen) == reference, at
        assert [t for d in seen for t in d.new_token_ids] == ids
        assert seen[-1].num_completion_tokens == len(ids) and seen[-1].finish_reason == FinishReason.LENGTH


def test_a_stop_string_straddling_the_failover_point_ends_the_stream(tiny_llama):
    from accel.text.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tiny_llama))
    ids = tok.encode("one two three four five six", add_special_tokens=False)
    request = GenerateRequest("q", (1, 2), SamplingParams(max_tokens=len(ids), stop=("three four",)))
    reference = _engine_deltas(tok, request, ids)
    assert reference[-1].stop_reason == "three four"
    for at in range(1, len(reference)):
        seen = _run_with_failover(tok, request, ids, at)
        assert "".join(d.text for d in seen) == "".join(d.text for d in reference), at
        assert seen[-1].finish_reason == FinishReason.STOP and seen[-1].stop_reason == "three four"
        assert [t for d in seen for t in d.new_token_ids] == [t for d in reference for t in d.new_token_ids]
