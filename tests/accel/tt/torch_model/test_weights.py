"""Checkpoint loading: fused projections, tied embeddings, missing tensors."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from accel.tt.torch_model.config import DecoderConfig
from accel.tt.torch_model.weights import checkpoint_files, load_weights


def test_tied_embeddings_share_the_matrix(tiny_qwen3):
    cfg = DecoderConfig.from_hf(AutoConfig.from_pretrained(tiny_qwen3))
    w = load_weights(tiny_qwen3, cfg, torch.device("cpu"), torch.float32)
    assert w.lm_head is w.embed
    assert w.layers[0].q_norm is not None and w.layers[0].qkv.shape == ((8 + 2 * 2) * 32, 256)


def test_untied_llama_and_fused_layout(tiny_llama):
    cfg = DecoderConfig.from_hf(AutoConfig.from_pretrained(tiny_llama))
    w = load_weights(tiny_llama, cfg, torch.device("cpu"), torch.float32)
    raw = load_file(str(checkpoint_files(tiny_llama)[0]))
    assert torch.equal(w.lm_head, raw["lm_head.weight"]) and w.lm_head is not w.embed
    assert torch.equal(w.layers[1].qkv[256:320], raw["model.layers.1.self_attn.k_proj.weight"])
    assert torch.equal(w.layers[3].gate_up[768:], raw["model.layers.3.mlp.up_proj.weight"])
    assert w.layers[0].q_norm is None


def test_missing_checkpoint(tmp_path, tiny_llama):
    with pytest.raises(FileNotFoundError):
        checkpoint_files(tmp_path)
