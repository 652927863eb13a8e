"""Linear layers: the oneDNN-packed path computes what F.linear computes, at every batch shape the
program runs (decode slots, prefill tokens, strided inputs), and falls back to dense when packing fails."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from accel.tt.torch_model.linear import Linear, can_pack

CPU = torch.device("cpu")
needs_onednn = pytest.mark.skipif(not can_pack(CPU, torch.float32), reason="torch without oneDNN")


def _weights(out_features: int = 96, in_features: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out_features, in_features, generator=g), torch.randn(out_features, generator=g)


@needs_onednn
@pytest.mark.parametrize("rows", [1, 7, 32, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_equals_dense_at_every_batch_size(rows, with_bias):
    w, b = _weights()
    bias = b if with_bias else None
    packed, dense = Linear.build(w, bias, pack=True), Linear.build(w, bias, pack=False)
    assert packed.packed is not None and packed.weight is None
    assert dense.packed is None and dense.weight is not None
    x = torch.randn(rows, 64)
    expected = F.linear(x, w, bias)
    torch.testing.assert_close(packed(x), expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(dense(x), expected, rtol=1e-5, atol=1e-4)


@needs_onednn
def test_packed_takes_strided_and_batched_inputs():
    # The down projection reads the gate half of the fused gate/up output (leading dim 2 * in).
    w, _ = _weights(32, 48)
    layer = Linear.build(w, pack=True)
    fused = torch.randn(5, 96)
    half = fused[:, :48]
    assert not half.is_contiguous()
    torch.testing.assert_close(layer(half), F.linear(half.contiguous(), w), rtol=1e-5, atol=1e-4)
    x3 = torch.randn(2, 3, 48)
    assert layer(x3).shape == (2, 3, 32)
    torch.testing.assert_close(layer(x3), F.linear(x3, w), rtol=1e-5, atol=1e-4)


@needs_onednn
def test_dense_recovers_the_packed_values_exactly():
    w, _ = _weights(40, 24)
    assert torch.equal(Linear.build(w, pack=True).dense(), w)
    assert torch.equal(Linear.build(w, pack=False).dense(), w)


def test_dense_weight_is_stored_input_major():
    w, _ = _weights()
    layer = Linear.build(w, pack=False)
    assert layer.weight is not None and layer.weight.t().is_contiguous() and torch.equal(layer.weight, w)


def test_packing_failure_falls_back_to_dense(monkeypatch, caplog):
    def refuse(weight, batch_size=None):
        raise RuntimeError("oneDNN: unsupported ISA")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse)
    w, b = _weights()
    with caplog.at_level(logging.WARNING, logger="accel.tt.torch_model.linear"):
        layer = Linear.build(w, b, pack=True)
    assert layer.packed is None and "unsupported ISA" in caplog.text
    x = torch.randn(4, 64)
    torch.testing.assert_close(layer(x), F.linear(x, w, b))


def test_only_cpu_float_dtypes_pack():
    assert not can_pack(torch.device("cuda"), torch.float32)
    assert not can_pack(CPU, torch.float16)
    assert can_pack(CPU, torch.float32) == torch.backends.mkldnn.is_available()
