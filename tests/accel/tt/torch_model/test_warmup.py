"""The torch program's fixed shapes (its warmup is exercised on a model in tests/accel/tt/test_torch_model.py)."""

from __future__ import annotations

from accel.tt.torch_model.warmup import next_pow2, prefill_bucket, round_up


def test_prefill_buckets():
    assert [prefill_bucket(n) for n in (1, 128, 129, 256, 257, 3000)] == [128, 128, 256, 256, 512, 4096]


def test_shape_helpers():
    assert [next_pow2(n) for n in (0, 1, 2, 3, 4, 5, 9)] == [1, 1, 2, 4, 4, 8, 16]
    assert [round_up(n, 16) for n in (1, 16, 17, 32)] == [16, 16, 32, 32]
