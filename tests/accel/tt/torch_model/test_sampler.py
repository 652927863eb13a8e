"""The in-program sampler: §6 normalization, the 32-candidate set, seeds, logprobs."""

from __future__ import annotations

import torch

from accel.tt.mesh_model import TTSamplingParams
from accel.tt.torch_model.sampler import DecodeSamplingCache, prepare_sampling, sample

VOCAB = 100


def params(rows: int, **overrides) -> TTSamplingParams:
    values = {k: [v] * rows for k, v in TTSamplingParams.PAD_DEFAULTS.items()}
    values.update({k: list(v) for k, v in overrides.items()})
    values["enable_log_probs"] = [n >= 0 for n in values["num_logprobs"]]  # as the plugin sets it
    return TTSamplingParams(**values)


def test_pad_defaults_are_greedy_without_logprobs():
    prep = prepare_sampling(params(3), [4, 5, 6], VOCAB, torch.device("cpu"))
    assert prep.is_greedy.tolist() == [True] * 3 and not prep.wants_logprobs
    assert prep.seeds == (None, None, None)  # tt-metal: None = unseeded


def test_top_k_one_collapses_the_nucleus_and_temperature_zero_is_greedy():
    prep = prepare_sampling(
        params(3, top_k=[1, 0, 10], temperature=[0.9, 0.0, 0.9], top_p=[0.5, 0.5, 0.5]),
        [0, 0, 0],
        VOCAB,
        torch.device("cpu"),
    )
    assert prep.is_greedy.tolist() == [True, True, False]
    assert prep.top_p.tolist() == [0.0, 0.0, 0.5]
    assert prep.top_k.tolist() == [1, VOCAB, 10]


def test_greedy_rows_take_the_argmax():
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(0))
    out = sample(
        logits,
        prepare_sampling(params(4), [0] * 4, VOCAB, torch.device("cpu")),
        torch.Generator().manual_seed(1),
        max_top_k=32,
    )
    assert out.token_ids.tolist() == logits.argmax(-1).tolist() and out.logprobs is None


def test_mixed_batch_greedy_rows_match_the_all_greedy_path():
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(2))
    mixed = prepare_sampling(
        params(4, temperature=[0.0, 0.8, 0.0, 0.8], top_k=[1, 20, 1, 20], num_logprobs=[0] * 4),
        [0] * 4,
        VOCAB,
        torch.device("cpu"),
    )
    greedy = prepare_sampling(params(4, num_logprobs=[0] * 4), [0] * 4, VOCAB, torch.device("cpu"))
    assert greedy.is_all_greedy and not mixed.is_all_greedy
    a = sample(logits, mixed, torch.Generator().manual_seed(1), max_top_k=32)
    b = sample(logits, greedy, torch.Generator().manual_seed(1), max_top_k=32)
    assert a.token_ids[[0, 2]].tolist() == b.token_ids[[0, 2]].tolist() == logits.argmax(-1)[[0, 2]].tolist()
    assert torch.allclose(b.logprobs, logits.log_softmax(-1).gather(1, b.token_ids[:, None]).squeeze(1))


def test_decode_cache_reuses_tensors_until_a_value_changes():
    cache = DecodeSamplingCache(VOCAB, torch.device("cpu"))
    p = params(2, temperature=[0.0, 0.7], top_k=[1, 5], seed=[None, 3])
    first = cache.prepare(p, [4, 5])
    second = cache.prepare(p, [5, 6])
    assert second.temperature is first.temperature and second.positions == (5, 6)
    p.top_k[1] = 7  # the lists are mutable: a changed value must not reuse stale tensors
    third = cache.prepare(p, [6, 7])
    assert third.top_k.tolist() == [1, 7] and third.positions == (6, 7)


def test_candidates_capped_at_max_top_k():
    logits = torch.linspace(0, 1, VOCAB).repeat(64, 1)  # nearly flat: every candidate is likely
    prep = prepare_sampling(
        params(64, temperature=[10.0] * 64, top_k=[-1] * 64, seed=list(range(64))), [0] * 64, VOCAB, torch.device("cpu")
    )
    out = sample(logits, prep, torch.Generator().manual_seed(0), max_top_k=32)
    assert int(out.token_ids.min()) >= VOCAB - 32  # only the 32 largest logits are candidates
    assert len(set(out.token_ids.tolist())) > 8


def test_seeds_reproduce_per_position_and_unseeded_rows_vary():
    logits = torch.zeros(2, VOCAB)

    def draw(seed, pos, gen_seed):
        prep = prepare_sampling(
            params(2, temperature=[1.0, 1.0], top_k=[-1, -1], seed=[seed, None]), [pos, pos], VOCAB, torch.device("cpu")
        )
        return sample(logits, prep, torch.Generator().manual_seed(gen_seed), max_top_k=32).token_ids.tolist()

    assert draw(5, 10, 0)[0] == draw(5, 10, 99)[0]  # seeded row ignores the shared generator
    assert len({draw(5, p, 0)[0] for p in range(20)}) > 1  # and advances with the position
    assert len({draw(5, 10, g)[1] for g in range(20)}) > 1  # unseeded row follows the shared generator


def test_logprobs_are_raw_log_softmax_of_the_sampled_token():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(3))
    prep = prepare_sampling(
        params(3, temperature=[0.5] * 3, top_k=[5] * 3, num_logprobs=[0, -2, 1], seed=[1, 2, 3]),
        [0] * 3,
        VOCAB,
        torch.device("cpu"),
    )
    out = sample(logits, prep, torch.Generator().manual_seed(0), max_top_k=32)
    expected = logits.log_softmax(-1).gather(1, out.token_ids[:, None]).squeeze(1)
    assert torch.allclose(out.logprobs, expected)


def test_penalties_are_refused_not_ignored():
    import pytest

    with pytest.raises(ValueError, match="repetition_penalty.*host"):
        prepare_sampling(params(2, repetition_penalty=[1.0, 1.2]), [0, 0], VOCAB, torch.device("cpu"))
    with pytest.raises(ValueError, match="rows"):
        prepare_sampling(params(2, top_k=[1]), [0, 0], VOCAB, torch.device("cpu"))
