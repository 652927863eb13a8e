"""host_arrays: numpy views and snapshots of step inputs."""

from __future__ import annotations

import numpy as np
import torch

from accel.tt.host_arrays import host_array, host_copy


def test_host_array_shares_a_cpu_tensors_memory():
    tokens = torch.zeros(4, 1, dtype=torch.int64)
    view = host_array(tokens)
    view[[1, 3], 0] = [7, 9]  # how the runner feeds pending tokens into a prepared step
    assert tokens[:, 0].tolist() == [0, 7, 0, 9]


def test_host_array_takes_lists_and_tensors_that_need_grad():
    assert host_array([1, 2, 3]).tolist() == [1, 2, 3]
    weights = torch.ones(3, requires_grad=True)
    assert host_array(weights).tolist() == [1.0, 1.0, 1.0]


def test_host_copy_is_a_snapshot_in_the_asked_dtype():
    table = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)
    snapshot = host_copy(table, np.int64)
    table[0, 0] = 99
    assert snapshot.dtype == np.int64 and snapshot.tolist() == [[1, 2], [3, 4]]
