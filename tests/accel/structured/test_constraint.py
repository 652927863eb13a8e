"""LogitsConstraint: the grammar mask and its advance, allowed_token_ids and bad_words (held
against vLLM's own bad-words op), the reasoning-end start, and the host sampler using them."""

from __future__ import annotations

import pytest
import torch

from accel.contract import SamplingParams, StructuredOutputSpec
from accel.structured.constraint import LogitsConstraint, mask_grammar, mask_token_lists
from accel.structured.grammar import GrammarCompiler
from accel.text.tokenizer import load_tokenizer
from accel.tt.host_sampler import sample_on_host
from accel.tt.step_plan import RowPlan

VOCAB = 1024
EOS = 1


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return load_tokenizer(str(tiny_llama))


@pytest.fixture(scope="module")
def compiler(tok):
    return GrammarCompiler(tok.hf, VOCAB)


def _constraint(compiler, **sp) -> LogitsConstraint:
    params = SamplingParams(temperature=0, **sp)
    spec = params.structured_outputs
    return LogitsConstraint(params, compiler.compile(spec) if spec else None, {EOS}, VOCAB)


def _row(sp: SamplingParams, rid: str = "a") -> RowPlan:
    return RowPlan(rid, 0, 0, 3, 4, (3,), (0,), True, sp, 0)


def _greedy_text(tok, c: LogitsConstraint, logits: torch.Tensor, steps: int) -> tuple[list[int], str]:
    """Greedy decode under ``c`` with fixed random logits per step (as the host sampler does)."""
    out = []
    for i in range(steps):
        x = logits[i % len(logits)].clone()[None]
        mask_grammar(x, [c])
        mask_token_lists(x, [c])
        t = int(x.argmax())
        out.append(t)
        c.accept(t)
        if t == EOS:
            break
    return out, tok.decode(out)


def test_choice_grammar_forces_a_choice_then_eos(tok, compiler):
    c = _constraint(compiler, structured_outputs=StructuredOutputSpec(choice=["yes", "no way"]))
    ids, text = _greedy_text(tok, c, torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(0)), 32)
    assert ids[-1] == EOS and text in ("yes", "no way")
    assert c.is_terminated and not c.uses_grammar  # terminated: no longer masked


def test_reasoning_end_starts_the_grammar(tok, compiler):
    end = (7, 8)
    spec = StructuredOutputSpec(regex="[0-9]", reasoning_end_token_ids=end)
    c = _constraint(compiler, structured_outputs=spec)
    for t in (5, 7, 6, 7):  # free while thinking; the end sequence has not appeared yet
        assert not c.uses_grammar
        c.accept(t)
    c.accept(8)  # ... 7, 8: reasoning ended
    assert c.uses_grammar
    x = torch.zeros(1, VOCAB)
    mask_grammar(x, [c])
    allowed = [tok.decode([i]) for i in torch.nonzero(x[0] == 0).flatten().tolist()]
    assert allowed and all(a.isdigit() for a in allowed)


def test_allowed_token_ids(compiler):
    c = _constraint(compiler, allowed_token_ids=[3, 900])
    x = torch.zeros(2, VOCAB)
    mask_token_lists(x, [c, None])
    assert torch.isfinite(x[0]).nonzero().flatten().tolist() == [3, 900]
    assert torch.isfinite(x[1]).all()


def test_bad_words_match_vllm(compiler):
    from vllm.v1.sample.ops.bad_words import apply_bad_words

    words = ((5,), (6, 7), (6, 8, 9), (4, 4))
    c = _constraint(compiler, bad_words=["w"], bad_words_token_ids=words)
    for history in ([], [6], [6, 8], [4], [1, 6, 8], [4, 4, 6]):
        c.output_token_ids = list(history)
        ours = torch.zeros(1, VOCAB)
        mask_token_lists(ours, [c])
        theirs = torch.zeros(1, VOCAB)
        apply_bad_words(theirs, {0: [list(w) for w in words]}, [list(history)])
        assert torch.equal(ours, theirs), history


def test_host_sampler_masks_only_constrained_rows(tok, compiler):
    c = _constraint(compiler, structured_outputs=StructuredOutputSpec(regex="[0-9]+"))
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(1))
    rows = [_row(SamplingParams(temperature=0), "free"), _row(SamplingParams(temperature=0, logprobs=2), "c")]
    out = sample_on_host(logits, rows, torch.Generator(), frozenset({EOS}), [None, c])
    assert out.token_ids[0] == int(logits[0].argmax())
    assert tok.decode([out.token_ids[1]]).isdigit()
    # raw logprobs see the grammar mask (vLLM applies it before its sampler)
    lp = out.logprobs[1]
    assert lp is not None and all(tok.decode([t]).isdigit() for t, _ in lp.top)
    assert torch.isfinite(logits).all()  # the program's output is never written
