"""Checkpoint loading: fused projections, tied embeddings, packed and dense layers, missing tensors."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from accel.tt.torch_model.config import DecoderConfig
from accel.tt.torch_model.linear import can_pack
from accel.tt.torch_model.weights import checkpoint_files, load_weights

CPU = torch.device("cpu")


def test_tied_embeddings_share_the_matrix_when_dense(tiny_qwen3):
    cfg = DecoderConfig.from_hf(AutoConfig.from_pretrained(tiny_qwen3))
    w = load_weights(tiny_qwen3, cfg, CPU, torch.float32, pack_linear=False)
    assert w.lm_head.weight is w.embed and w.lm_head.packed is None
    assert w.layers[0].q_norm is not None and w.layers[0].qkv.dense().shape == ((8 + 2 * 2) * 32, 256)


@pytest.mark.skipif(not can_pack(CPU, torch.float32), reason="torch without oneDNN")
def test_tied_embeddings_packed_hold_the_embedding_values(tiny_qwen3):
    cfg = DecoderConfig.from_hf(AutoConfig.from_pretrained(tiny_qwen3))
    w = load_weights(tiny_qwen3, cfg, CPU, torch.float32)  # the default on this CPU: packed
    assert w.lm_head.weight is None and w.lm_head.packed is not None
    assert torch.equal(w.lm_head.dense(), w.embed)


@pytest.mark.parametrize("pack", [False, True] if can_pack(CPU, torch.float32) else [False])
def test_untied_llama_and_fused_layout(tiny_llama, pack):
    cfg = DecoderConfig.from_hf(AutoConfig.from_pretrained(tiny_llama))
    w = load_weights(tiny_llama, cfg, CPU, torch.float32, pack_linear=pack)
    raw = load_file(str(checkpoint_files(tiny_llama)[0]))
    assert (w.layers[0].qkv.packed is not None) == pack
    assert torch.equal(w.lm_head.dense(), raw["lm_head.weight"]) and w.lm_head.weight is not w.embed
    assert torch.equal(w.layers[1].qkv.dense()[256:320], raw["model.layers.1.self_attn.k_proj.weight"])
    assert torch.equal(w.layers[3].gate_up.dense()[768:], raw["model.layers.3.mlp.up_proj.weight"])
    assert torch.equal(w.layers[2].down.dense(), raw["model.layers.2.mlp.down_proj.weight"])
    assert w.layers[0].q_norm is None


def test_missing_checkpoint(tmp_path, tiny_llama):
    with pytest.raises(FileNotFoundError):
        checkpoint_files(tmp_path)
