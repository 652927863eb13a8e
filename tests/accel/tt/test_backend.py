"""Backend choice, the one-line "no Tenstorrent device" error, the signature-aware loader, and the
TTNN path end to end against the ttnn stub and a fake tt-metal model."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from accel.tt.backend import (
    NoTenstorrentDevice,
    TtnnEvent,
    TtnnMeshModel,
    load_mesh_model,
    open_backend,
    ttnn_error_reason,
)
from accel.tt.mesh_device import TTNN_CALLS, MeshDeviceConfig
from accel.tt.registry import build_registry

EXTRA_MODELS_DIR = Path(__file__).resolve().parents[2] / "doubles" / "stubs" / "extra_models"


def llama_config():
    return SimpleNamespace(architectures=["LlamaForCausalLM"])


def test_torch_backend_needs_nothing():
    backend = open_backend("torch")
    assert backend.kind == "torch" and backend.mesh_device is None
    backend.close()
    with pytest.raises(ValueError, match="backend must be"):
        open_backend("gpu")


def test_ttnn_not_importable_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ttnn", None)  # import ttnn -> ImportError
    with pytest.raises(NoTenstorrentDevice) as err:
        open_backend("ttnn")
    assert str(err.value).startswith("no Tenstorrent device found: the ttnn package is not importable")
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert open_backend("auto").kind == "torch"


def test_no_chips_is_one_clear_error(ttnn_stub):
    with pytest.raises(NoTenstorrentDevice) as err:
        open_backend("ttnn")
    assert str(err.value) == "no Tenstorrent device found: No chips detected in the cluster"
    assert "backtrace" not in str(err.value) and err.value.__suppress_context__
    assert open_backend("auto").kind == "torch"


def test_too_few_chips_for_the_mesh(ttnn_stub):
    ttnn_stub._stub_simulate(2, ttnn_stub.cluster.ClusterType.N300)
    with pytest.raises(NoTenstorrentDevice, match=r"\(1, 8\).*8 chips needed, 2 present"):
        open_backend("ttnn", MeshDeviceConfig(grid=(1, 8)))


def test_error_reason_keeps_the_human_line():
    assert (
        ttnn_error_reason(RuntimeError("TT_FATAL @ x.cpp:1: a\ninfo:\nthe reason\nbacktrace:\n --- f")) == "the reason"
    )
    assert ttnn_error_reason(RuntimeError("plain\nmore")) == "plain"


class _OldStyle:
    seen: dict = {}

    @classmethod
    def initialize_vllm_model(cls, hf_config, mesh_device, max_batch_size, n_layers=None, tt_data_parallel=1):
        cls.seen = dict(max_batch_size=max_batch_size, n_layers=n_layers, tt_data_parallel=tt_data_parallel)
        return cls()


class _TakesKwargs:
    @classmethod
    def initialize_vllm_model(cls, hf_config, mesh_device, max_batch_size, **kwargs):
        obj = cls()
        obj.kwargs = kwargs
        return obj


def test_loader_passes_only_accepted_keywords():
    load_mesh_model(
        _OldStyle,
        llama_config(),
        None,
        8,
        max_seq_len=4096,
        n_layers=2,
        tt_data_parallel=2,
        optimizations="performance",
    )
    assert _OldStyle.seen == dict(max_batch_size=8, n_layers=2, tt_data_parallel=2)
    model = load_mesh_model(_TakesKwargs, llama_config(), None, 8, max_seq_len=4096, optimizations=None)
    assert model.kwargs == dict(max_seq_len=4096, optimizations=None)


def test_ttnn_path_end_to_end_with_fake_model(ttnn_stub):
    ttnn = ttnn_stub
    ttnn._stub_simulate(8, ttnn.cluster.ClusterType.T3K)
    registry = build_registry(extra_models_dir=EXTRA_MODELS_DIR, include_builtins=True)
    backend = open_backend("ttnn", MeshDeviceConfig(grid=(1, 8), dispatch_core_axis="row"), registry=registry)
    assert backend.kind == "ttnn"
    model = backend.load_model(
        llama_config(), 8, max_seq_len=256, n_layers=None, tt_data_parallel=4, optimizations="performance"
    )  # the fake (older class) lacks optimizations
    assert isinstance(model, TtnnMeshModel) and model.model_capabilities["supports_async_decode"]
    fake = model._model
    assert (fake.max_batch_size, fake.num_lanes, fake.max_seq_len) == (8, 4, 256)
    kv = model.allocate_kv_cache((16, 1, 32, 64), torch.bfloat16, 2)
    logits = model.prefill_forward(
        tokens=torch.tensor([[5, 6, 7], [9, 0, 0]]),
        page_table=torch.zeros(2, 8, dtype=torch.int32),
        kv_cache=kv,
        prompt_lens=[3, 1],
        start_pos=[0, 0],
        empty_slots=[0, 7],
    )
    assert logits[:, 0].argmax(-1).tolist() == [8, 10]
    tokens = torch.zeros(8, 1, dtype=torch.int64)
    tokens[0, 0], tokens[7, 0] = 8, 10
    start_pos = torch.full((8,), -1, dtype=torch.int32)
    start_pos[0], start_pos[7] = 3, 1
    handle = model.decode_forward(
        tokens=tokens,
        start_pos=start_pos,
        page_table=torch.zeros(8, 8, dtype=torch.int32),
        kv_cache=kv,
        enable_trace=True,
        read_from_device=False,
    )
    out, events = model.read_decode_output(handle, async_read=True)
    assert len(events) == 1 and isinstance(events[0], TtnnEvent)
    for ev in events:
        ev.synchronize()
    host = model.process_decode_output_host(out, is_tokens=False)
    assert host.shape == (8, 1, 64) and host[[0, 7], -1].argmax(-1).tolist() == [9, 11]
    sync_out = model.read_decode_output(
        model.decode_forward(
            tokens=tokens,
            start_pos=start_pos,
            page_table=torch.zeros(8, 8, dtype=torch.int32),
            kv_cache=kv,
            read_from_device=False,
        ),
        async_read=False,
    )
    assert torch.equal(sync_out[[0, 7]], host[[0, 7]])  # tt-metal: a sync read gives the host output alone
    names = [c[0] for c in ttnn._stub_calls]
    assert names.index("record_event") < names.index("event_synchronize")
    backend.close()
    assert [c[0] for c in ttnn._stub_calls][-2:] == ["close_mesh_device", "set_fabric_config"]
    for name, _, kwargs in ttnn._stub_calls:
        assert name in TTNN_CALLS and set(kwargs) <= set(TTNN_CALLS[name]), (name, kwargs)


def test_grid_from_mesh_device_env_or_all_chips(ttnn_stub, monkeypatch):
    import accel.envs

    ttnn_stub._stub_simulate(8, ttnn_stub.cluster.ClusterType.T3K)
    backend = open_backend("ttnn", registry=build_registry(extra_models_dir="", include_builtins=True))
    assert backend.mesh.grid == (1, 8)  # MESH_DEVICE unset: every chip
    monkeypatch.setattr(accel.envs, "ENVS", accel.envs.Envs(**{**vars(accel.envs.ENVS), "mesh_device": "N300"}))
    backend = open_backend("ttnn", MeshDeviceConfig(dispatch_core_axis="row"))
    assert backend.mesh.grid == (1, 2)
    monkeypatch.setattr(accel.envs, "ENVS", accel.envs.Envs(**{**vars(accel.envs.ENVS), "mesh_device": "XYZ"}))
    with pytest.raises(ValueError, match="unknown MESH_DEVICE 'XYZ'"):
        open_backend("ttnn")


def test_torch_backend_loads_the_torch_mesh_model(tiny_qwen3):
    from transformers import AutoConfig

    from accel.tt.torch_model import TorchMeshModel

    backend = open_backend("torch", registry=build_registry(extra_models_dir="", include_builtins=True))
    model = backend.load_model(
        AutoConfig.from_pretrained(tiny_qwen3),
        4,
        max_seq_len=128,
        n_layers=None,
        tt_data_parallel=2,
        optimizations="performance",
    )
    try:
        assert isinstance(model, TorchMeshModel) and (model.num_lanes, model.per_lane) == (2, 2)
    finally:
        model.close()
    with pytest.raises(Exception, match="TTGemma3ForConditionalGeneration needs a Tenstorrent mesh"):
        backend.load_model(SimpleNamespace(architectures=["Gemma3ForConditionalGeneration"]), 4)


def test_use_host_inputs_marks_the_generators_prefilled_slots():
    """The mark lands in the set tt-metal's ``Generator.decode_forward`` reads at a reset step
    (``_slots_prefilled_since_decode``): created when the generator has none yet, added to the
    one its ``prefill_forward_text`` filled otherwise (the generator rebinds it after each decode)."""
    fresh = SimpleNamespace()
    TtnnMeshModel(fresh, ttnn=None).use_host_inputs((3, 1))
    assert fresh._slots_prefilled_since_decode == {1, 3}
    prefilled = SimpleNamespace(_slots_prefilled_since_decode={0})
    before = prefilled._slots_prefilled_since_decode
    TtnnMeshModel(prefilled, ttnn=None).use_host_inputs([2])
    assert prefilled._slots_prefilled_since_decode is before and before == {0, 2}
