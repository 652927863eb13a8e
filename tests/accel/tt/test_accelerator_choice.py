"""``accelerator: tt`` means the ttnn mesh or a startup error that names what is missing; the
torch program only runs for ``accelerator: cpu`` / ``cuda``."""

from __future__ import annotations

import sys

import pytest

from accel.contract import ConfigError
from accel.tt.backend import NoTenstorrentDevice
from accel.tt.config import TTEngineConfig
from accel.tt.engine import TTMeshEngine
from accel.tt.model_setup import open_default_backend


def _config(tiny_llama, **tt):
    return TTEngineConfig.from_engine_args(
        dict(model=str(tiny_llama), max_num_seqs=2, max_model_len=128, additional_config={"tt": tt})
    )


def test_tt_without_ttnn_is_a_startup_error_not_the_torch_program(tiny_llama, monkeypatch):
    monkeypatch.setitem(sys.modules, "ttnn", None)  # import ttnn -> ImportError, as on a 3.11 host
    with pytest.raises(NoTenstorrentDevice, match="the ttnn package is not importable"):
        TTMeshEngine(_config(tiny_llama), accelerator="tt")


def test_tt_without_chips_names_the_reason(ttnn_stub, tiny_llama):
    with pytest.raises(NoTenstorrentDevice, match="No chips detected in the cluster"):
        open_default_backend(_config(tiny_llama), "tt")


def test_mesh_larger_than_the_visible_chips(ttnn_stub, tiny_llama, monkeypatch):
    ttnn_stub._stub_simulate(2, ttnn_stub.cluster.ClusterType.N300)
    monkeypatch.setenv("MESH_DEVICE", "T3K")
    from accel import envs

    monkeypatch.setattr(envs, "ENVS", envs._read())
    with pytest.raises(NoTenstorrentDevice, match="8 chips needed, 2 present"):
        open_default_backend(_config(tiny_llama), "tt")


def test_cpu_runs_the_torch_program_and_tpu_is_refused(tiny_llama):
    assert open_default_backend(_config(tiny_llama), "cpu").kind == "torch"
    with pytest.raises(ConfigError, match="accelerator 'tpu'"):
        open_default_backend(_config(tiny_llama), "tpu")
