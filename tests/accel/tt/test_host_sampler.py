"""Host sampler: processors, sampling filters, logprobs, seeded reproducibility."""

from __future__ import annotations

import math

import torch

from accel.contract import SamplingParams
from accel.tt.host_sampler import sample_on_host
from accel.tt.step_plan import RowPlan

VOCAB = 16
EOS = frozenset({1})


def row(rid="a", num_output=0, history=None, end_pos=4, **sp):
    return RowPlan(
        req_id=rid,
        lane=0,
        row=0,
        start_pos=end_pos - 1,
        end_pos=end_pos,
        input_token_ids=(3,),
        block_ids=(0,),
        samples=True,
        sampling=SamplingParams(**sp),
        num_output_tokens=num_output,
        history_token_ids=history,
    )


def logits_row(top=5, second=6):
    x = torch.full((VOCAB,), -5.0)
    x[top], x[second] = 3.0, 2.5
    return x


def gen(seed=0):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def sample(rows, logits, seed=0):
    return sample_on_host(torch.stack(logits), rows, gen(seed), EOS)


def test_greedy_takes_argmax_per_row():
    out = sample([row(temperature=0), row("b", temperature=0)], [logits_row(5), logits_row(9, 2)])
    assert out.token_ids == (5, 9) and out.logprobs is None


def test_logit_bias_and_min_tokens():
    out = sample([row(temperature=0, logit_bias={"6": 1.0})], [logits_row(5, 6)])
    assert out.token_ids == (6,)
    x = logits_row(1, 7)  # eos on top
    assert sample([row(temperature=0, min_tokens=2, max_tokens=4, num_output=1)], [x]).token_ids == (7,)
    assert sample([row(temperature=0, min_tokens=2, max_tokens=4, num_output=2)], [x]).token_ids == (1,)
    stop = sample([row(temperature=0, min_tokens=1, stop_token_ids=[7], ignore_eos=True)], [logits_row(7, 4)])
    assert stop.token_ids == (4,)


def test_penalties_use_prompt_and_outputs():
    # history = prompt (3 tokens) + outputs [5, 5]; num_output 2
    hist = (9, 9, 9, 5, 5)
    out = sample([row(temperature=0, frequency_penalty=0.4, num_output=2, history=hist)], [logits_row(5, 6)])
    assert out.token_ids == (6,)  # 3.0 - 2*0.4 = 2.2 < 2.5
    out = sample([row(temperature=0, presence_penalty=0.4, num_output=2, history=hist)], [logits_row(5, 6)])
    assert out.token_ids == (5,)  # 3.0 - 0.4 = 2.6 > 2.5
    out = sample([row(temperature=0, repetition_penalty=1.5, num_output=2, history=hist)], [logits_row(5, 6)])
    assert out.token_ids == (6,)  # 3.0 / 1.5 = 2.0 < 2.5


def test_top_k_top_p_min_p_restrict_the_support():
    x = torch.linspace(0, 3, VOCAB)  # token 15 best, 14 next, ...
    draws = {sample([row(temperature=1.0, top_k=2)], [x], seed=s).token_ids[0] for s in range(60)}
    assert draws == {14, 15}
    draws = {sample([row(temperature=1.0, top_p=0.05)], [x], seed=s).token_ids[0] for s in range(30)}
    assert draws == {15}
    draws = {sample([row(temperature=1.0, min_p=0.7)], [x], seed=s).token_ids[0] for s in range(60)}
    assert draws <= {15, 14, 13} and 15 in draws


def test_seeded_rows_reproduce_independent_of_engine_generator_and_batch():
    x = torch.zeros(VOCAB)
    a = sample([row(temperature=1.0, seed=123)], [x], seed=1).token_ids
    b = sample([row("other", temperature=1.0), row(temperature=1.0, seed=123)], [x, x], seed=99).token_ids
    assert a[0] == b[1]
    later = sample([row(temperature=1.0, seed=123, end_pos=5)], [x], seed=1).token_ids
    many = {sample([row(temperature=1.0, seed=123, end_pos=p)], [x]).token_ids[0] for p in range(4, 40)}
    assert len(many) > 3 and isinstance(later[0], int)


def test_logprobs_are_raw_with_top_alternatives():
    x = logits_row(5, 6)
    out = sample([row(temperature=0, logprobs=2), row("b", temperature=0)], [x, x])
    lp = out.logprobs[0]
    expected = torch.log_softmax(x, -1)
    assert lp.token_id == 5 and math.isclose(lp.logprob, float(expected[5]), rel_tol=1e-6)
    assert [t for t, _ in lp.top] == [5, 6]
    assert out.logprobs[1] is None
