"""RoPE inverse frequencies (incl. llama3 scaling from rope_parameters) equal HF's."""

from __future__ import annotations

import dataclasses

import torch
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from accel.tt.torch_model.config import DecoderConfig
from accel.tt.torch_model.layers import RotaryTables, rms_norm, rope_inv_freq


def test_llama3_rope_matches_hf(tiny_llama):
    hf = AutoConfig.from_pretrained(tiny_llama)
    cfg = DecoderConfig.from_hf(hf)
    assert cfg.rope_parameters["rope_type"] == "llama3"
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    assert torch.allclose(rope_inv_freq(cfg), expected)
    default = dataclasses.replace(cfg, rope_parameters={"rope_theta": 500000.0})
    assert not torch.allclose(rope_inv_freq(default), expected)  # the scaling really changes them


def test_qwen3_config(tiny_qwen3):
    cfg = DecoderConfig.from_hf(AutoConfig.from_pretrained(tiny_qwen3), n_layers=2)
    assert cfg.has_qk_norm and cfg.tie_word_embeddings and cfg.num_layers == 2
    assert cfg.num_queries_per_kv == 4 and cfg.rope_theta == 1e6


def test_rotation_preserves_norm_and_is_identity_at_zero(tiny_llama):
    cfg = DecoderConfig.from_hf(AutoConfig.from_pretrained(tiny_llama))
    rope = RotaryTables.build(cfg, 64, torch.device("cpu"), torch.float32)
    x = torch.randn(5, 8, 32)
    pos = torch.tensor([0, 1, 7, 30, 63])
    y = rope.apply(x, pos)
    assert torch.allclose(y[0], x[0]) and torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5)


def test_rms_norm():
    x = torch.randn(3, 16)
    y = rms_norm(x, torch.ones(16), 1e-6)
    assert torch.allclose(y.pow(2).mean(-1), torch.ones(3), atol=1e-4)
