"""``accel.tt.model_output``: tt-metal's output shapes as the plugin accepts them."""

from __future__ import annotations

import math

import torch

from accel.contract import SamplingParams
from accel.tt.model_output import device_logprobs, finalize_decode, is_host_output, unpack_output
from accel.tt.step_plan import RowPlan


def _topk_pair(tokens: list[int], k: int = 32, vocab: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """A device sampler's top-k log probs ([rows, K] values, [rows, K] token ids): row i's ids are
    ``i, i+1, ...`` and the value of id j is ``-j / 10``."""
    indices = torch.stack([torch.arange(i, i + k) % vocab for i in range(len(tokens))])
    return -indices.float() / 10, indices.to(torch.int32)


def test_device_sampling_with_top_k_log_prob_pair():
    tokens = torch.tensor([5, 40, 7])  # row 2's ids are 2..33: 7 is there; row 1's are 1..32: 40 is not
    out = (tokens, _topk_pair([0, 1, 2]))
    host = unpack_output(out, is_tokens=True, wants_logprobs=True, num_rows=3)
    assert host.values.tolist() == [5, 40, 7]
    assert host.logprobs is not None
    assert math.isclose(host.logprobs[0].item(), -0.5, rel_tol=1e-6)
    assert math.isnan(host.logprobs[1].item())  # not among the top k: nothing claimed
    assert math.isclose(host.logprobs[2].item(), -0.7, rel_tol=1e-6)


def test_a_top_k_pair_is_already_a_host_output():
    tokens = torch.tensor([3, 4])
    out = (tokens, _topk_pair([0, 0]))
    assert is_host_output(out)

    class NoConversion:
        def process_decode_output_host(self, *_a, **_k):
            raise AssertionError("host tensors must not be converted again")

    host = finalize_decode(NoConversion(), out, [], is_tokens=True, wants_logprobs=True, num_rows=2)
    assert host.values.tolist() == [3, 4]


def test_token_tensors_of_every_shape_the_plugin_accepts():
    for shape in [(4,), (4, 1), (4, 1, 1)]:
        host = unpack_output(torch.arange(4).reshape(shape), is_tokens=True, wants_logprobs=False, num_rows=3)
        assert host.values.tolist() == [0, 1, 2]


def test_device_logprobs_take_the_best_of_the_top_k_pair():
    host = unpack_output((torch.tensor([5, 6]), _topk_pair([0, 0])), is_tokens=True, wants_logprobs=True, num_rows=2)
    rows = [
        RowPlan("a", 0, 0, 10, 11, (1,), (0,), True, SamplingParams(temperature=0, logprobs=2), 0),
        RowPlan("b", 0, 1, 10, 11, (1,), (0,), True, SamplingParams(temperature=0), 0),
    ]
    a, b = device_logprobs(rows, [0, 1], host)
    assert b is None and a is not None
    assert a.token_id == 5 and math.isclose(a.logprob, -0.5, rel_tol=1e-6)
    assert [t for t, _ in a.top] == [0, 1]  # ids 0 and 1 have the highest values (0, -0.1)
