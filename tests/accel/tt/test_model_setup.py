"""KV cache dtype choice: always a torch dtype (what the plugin hands tt-metal's allocators):
"auto" = the model's, vLLM's ``kv_cache_dtype`` spelling for overrides."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from accel.contract import ConfigError
from accel.tt.backend import open_backend
from accel.tt.config import TTEngineConfig
from accel.tt.mesh_device import MeshDeviceConfig
from accel.tt.model_setup import kv_dtype
from accel.tt.registry import build_registry

from .conftest import EXTRA_MODELS_DIR


def test_kv_cache_gets_a_torch_dtype_on_a_mesh_too(ttnn_stub):
    """The plugin hands tt-metal vLLM's torch KV dtype (tt-metal allocates ``torch.zeros(shape,
    dtype=dtype)`` and picks bfloat8_b itself): "auto" = the checkpoint's dtype."""
    ttnn = ttnn_stub
    ttnn._stub_simulate(8, ttnn.cluster.ClusterType.T3K)
    registry = build_registry(extra_models_dir=str(EXTRA_MODELS_DIR), include_builtins=True)
    backend = open_backend("ttnn", MeshDeviceConfig(grid=(1, 8), dispatch_core_axis="row"), registry=registry)
    hf_config = SimpleNamespace(architectures=["LlamaForCausalLM"], torch_dtype=torch.bfloat16)
    model = backend.load_model(hf_config, 8, max_seq_len=256, n_layers=None, tt_data_parallel=4)
    assert kv_dtype(model, hf_config) is torch.bfloat16
    assert kv_dtype(model, hf_config, "float32") is torch.float32
    assert kv_dtype(model, SimpleNamespace(torch_dtype="float32")) is torch.float32
    assert kv_dtype(model, SimpleNamespace()) is torch.bfloat16
    model.allocate_kv_cache((16, 1, 32, 64), kv_dtype(model, hf_config), 2)
    assert model._model.kv_dtype is torch.bfloat16
    with pytest.raises(TypeError):  # what a ttnn dtype did to tt-metal's allocator
        model.allocate_kv_cache((16, 1, 32, 64), ttnn.bfloat8_b, 2)
    backend.close()


def test_torch_program_keeps_the_model_dtype_by_default():
    model = SimpleNamespace(dtype=torch.float32)  # TorchMeshModel's compute dtype
    assert kv_dtype(model, SimpleNamespace(torch_dtype=torch.bfloat16)) is torch.float32
    assert kv_dtype(model, None, "bfloat16") is torch.bfloat16


def test_kv_cache_dtype_is_validated_in_vllm_spelling():
    assert TTEngineConfig.from_engine_args({"model": "m", "kv_cache_dtype": "bfloat16"}).kv_cache_dtype == "bfloat16"
    with pytest.raises(ConfigError, match="kv_cache_dtype: expected one of auto, bfloat16, float32, got 'fp8'"):
        TTEngineConfig.from_engine_args({"model": "m", "kv_cache_dtype": "fp8"})


def test_torch_engine_stores_kv_in_the_requested_dtype(tiny_llama):
    from accel.contract import GenerateRequest
    from accel.tt.torch_model import TorchMeshModel

    from .engine_harness import greedy, make_engine, prompt_of, run_requests, tokens_of

    engine = make_engine(tiny_llama, TorchMeshModel, kv_cache_dtype="bfloat16")
    try:
        assert engine.model._store.keys[0].dtype == torch.bfloat16
        out = run_requests(engine, [GenerateRequest(f"r{i}", prompt_of(i, 40), greedy(6)) for i in range(3)])
        assert all(len(tokens_of(deltas)) == 6 for deltas in out.values())
    finally:
        import asyncio

        asyncio.run(engine.shutdown())


def test_the_engine_drives_a_ttnn_model_through_its_event_adapter(ttnn_stub, tiny_llama):
    """On a mesh the engine gets ``TtnnMeshModel`` (device events with ``synchronize``), the same
    object ``MeshBackend.load_model`` gives, not the raw tt-metal model."""
    from accel.contract import GenerateRequest
    from accel.tt.backend import TtnnMeshModel
    from accel.tt.engine import TTMeshEngine

    from .engine_harness import greedy, run_requests, tokens_of

    ttnn = ttnn_stub
    ttnn._stub_simulate(8, ttnn.cluster.ClusterType.T3K)
    registry = build_registry(extra_models_dir=str(EXTRA_MODELS_DIR), include_builtins=True)
    backend = open_backend("ttnn", MeshDeviceConfig(grid=(1, 8), dispatch_core_axis="row"), registry=registry)
    config = TTEngineConfig.from_engine_args(
        dict(
            model=str(tiny_llama),
            max_num_seqs=2,
            data_parallel_size=4,
            block_size=32,
            max_model_len=256,
            async_scheduling=True,
            additional_config={"tt": {"enable_model_warmup": False}},
        )
    )
    engine = TTMeshEngine(config, backend=backend)
    try:
        assert isinstance(engine.model, TtnnMeshModel)
        assert engine.model._model.kv_dtype == torch.float32  # tiny-llama's checkpoint dtype
        out = run_requests(engine, [GenerateRequest("r", (5, 6, 7), greedy(4))])["r"]
        assert len(tokens_of(out)) == 4
    finally:
        engine.close()
