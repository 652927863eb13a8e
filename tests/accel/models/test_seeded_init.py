"""seeded_reinit: the same seed gives the same weights whatever transformers' init drew; norm
scales are 1, everything else drawn at the given scale."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from accel.models.seeded_init import seeded_reinit

CONFIG = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)


def _model(init_seed: int) -> LlamaForCausalLM:
    torch.manual_seed(init_seed)  # transformers' own init differs per seed
    return LlamaForCausalLM(CONFIG)


def test_same_seed_same_weights_whatever_the_init_drew() -> None:
    is_norm = lambda name: name.endswith("norm.weight")  # noqa: E731
    a = seeded_reinit(_model(1), 7, 0.1, is_norm).state_dict()
    b = seeded_reinit(_model(2), 7, 0.1, is_norm).state_dict()
    c = seeded_reinit(_model(1), 8, 0.1, is_norm).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["lm_head.weight"], c["lm_head.weight"])


def test_norm_scales_are_one_and_the_rest_drawn_at_weight_std() -> None:
    model = seeded_reinit(_model(0), 3, 0.02, lambda name: name.endswith("norm.weight"))
    assert not model.training
    params = dict(model.named_parameters())
    assert torch.equal(params["model.norm.weight"], torch.ones_like(params["model.norm.weight"]))
    drawn = params["model.embed_tokens.weight"]
    assert 0.01 < float(drawn.std()) < 0.03
