"""Device sampling arguments: §6 normalization of one request's parameters."""

from __future__ import annotations

from accel.contract import SamplingParams
from accel.tt.device_sampling_args import device_sampling_row


def test_device_sampling_row_normalization():
    assert device_sampling_row(SamplingParams(temperature=0.8, top_k=0, top_p=0.9, seed=4), 64) == (
        0.8,
        64,
        0.9,
        0.0,
        0.0,
        1.0,
        4,
        -2,
        False,
    )
    assert device_sampling_row(SamplingParams(temperature=0.8, top_k=1, logprobs=2), 64)[:3] == (0.0, 1, 0.0)
    assert device_sampling_row(SamplingParams(temperature=0.8, top_k=100), 64)[1] == 64
