import dataclasses
from pathlib import Path

import pytest

from accel.contract import ConfigError
from accel.vllm.config import VllmEngineConfig, model_slug
from accel.vllm.tpu.topology import parse_slice


def test_from_engine_args_passes_vllm_spellings_through():
    args = {
        "model": "/ckpt/llama",
        "tensor_parallel_size": 8,
        "data_parallel_size": 2,
        "enable_expert_parallel": True,
        "max_model_len": 4096,
        "max_num_seqs": 64,
        "kv_cache_dtype": "fp8",
        "enable_prefix_caching": True,
        "async_scheduling": True,
        "additional_config": {"sharding": {"sharding_strategy": {"tensor_parallelism": 8}}},
        "block_size": 32,
        "dtype": "bfloat16",
        "enforce_eager": False,
        "seed": 3,
        "max_num_batched_tokens": 2048,
        "gpu_memory_utilization": 0.8,
        "kv_transfer_config": {"kv_connector": "TPUConnector", "kv_role": "kv_producer"},
    }
    cfg = VllmEngineConfig.from_engine_args(args)
    out = cfg.engine_args(parse_slice("v6e", "2x4"), tensor_parallel_size=8)
    assert out == args  # single host: no executor override, nothing added or renamed


def test_unset_values_are_left_to_vllm():
    out = VllmEngineConfig.from_engine_args({"model": "m"}).engine_args(None, tensor_parallel_size=1)
    assert out == {"model": "m", "tensor_parallel_size": 1}


def test_multi_host_slice_uses_ray_executor():
    cfg = VllmEngineConfig.from_engine_args({"model": "m"})
    assert cfg.engine_args(parse_slice("v5e", "4x4"), 16)["distributed_executor_backend"] == "ray"
    explicit = VllmEngineConfig.from_engine_args({"model": "m", "distributed_executor_backend": "mp"})
    assert explicit.engine_args(parse_slice("v5e", "4x4"), 16)["distributed_executor_backend"] == "mp"


def test_every_vllm_serve_arg_is_accepted_and_typed_by_vllms_parser():
    """Keys meshserve does not read go to AsyncEngineArgs as `vllm serve` would type them; either
    spelling (underscores or vLLM's dashes) works."""
    from vllm.config import CompilationConfig

    cfg = VllmEngineConfig.from_engine_args(
        {
            "model": "m",
            "max-num-seqs": 4,
            "speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3},
            "enable_lora": True,
            "max_loras": 2,
            "max_lora_rank": 16,
            "compilation_config": {"mode": 0},
            "disable_sliding_window": False,
        }
    )
    assert cfg.max_num_seqs == 4
    assert set(cfg.extra_args) == {"speculative_config", "enable_lora", "max_loras", "max_lora_rank",
                                   "compilation_config", "disable_sliding_window"}  # fmt: skip
    out = cfg.engine_args(None, tensor_parallel_size=1)
    assert out["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    assert (out["enable_lora"], out["max_loras"], out["max_lora_rank"]) == (True, 2, 16)
    assert isinstance(out["compilation_config"], CompilationConfig) and out["compilation_config"].mode == 0
    assert out["disable_sliding_window"] is False


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("max_loras", "two", "max_loras: invalid int value: 'two'"),
        ("dtype", "float33", "dtype: invalid choice: 'float33'"),
        ("speculative_config", "{not json", "speculative_config: "),
        ("enable_lora", 1, "enable_lora: unexpected value '1'"),  # a flag given a value
        ("max_lorass", 2, "max_lorass: unknown engine arg"),
    ],
)
def test_vllms_parser_names_the_key_it_refuses(key, value, message):
    with pytest.raises(ConfigError) as err:
        VllmEngineConfig.from_engine_args({"model": "m", key: value})
    assert str(err.value).startswith(message)


def test_without_vllm_the_replica_is_the_first_to_check(monkeypatch):
    from accel.vllm import engine_arg_parser

    monkeypatch.setattr(engine_arg_parser, "_vllm_available", lambda: False)
    cfg = VllmEngineConfig.from_engine_args({"model": "m", "max_loras": 2})
    assert cfg.engine_args(None, tensor_parallel_size=1)["max_loras"] == 2


def test_unknown_key_named():
    with pytest.raises(ConfigError, match="^tensor_paralel_size: unknown engine arg"):
        VllmEngineConfig.from_engine_args({"model": "m", "tensor_paralel_size": 2})
    with pytest.raises(ConfigError, match="^model: missing"):
        VllmEngineConfig.from_engine_args({"dtype": "float32"})


@pytest.mark.parametrize(
    "key,value",
    [
        ("max_model_len", "512"),
        ("enforce_eager", 1),
        ("max_num_seqs", 0),
        ("gpu_memory_utilization", 1.5),
        ("additional_config", "x"),
        ("dtype", ""),
    ],
)
def test_bad_values_named(key, value):
    with pytest.raises(ConfigError, match=f"^{key}:"):
        VllmEngineConfig.from_engine_args({"model": "m", key: value})


def test_every_field_is_an_async_engine_arg():
    """Our spellings are vLLM's: each field exists on AsyncEngineArgs."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    vllm_fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    ours = {f.name for f in dataclasses.fields(VllmEngineConfig)} - {"xla_cache_root", "extra_args"}
    assert ours <= vllm_fields, ours - vllm_fields


def test_compile_cache_per_model(tmp_path: Path):
    a = VllmEngineConfig.from_engine_args({"model": "/ckpt/a/llama"}, xla_cache_root=tmp_path)
    a2 = VllmEngineConfig.from_engine_args({"model": "/ckpt/a/llama", "max_num_seqs": 4}, xla_cache_root=tmp_path)
    b = VllmEngineConfig.from_engine_args({"model": "/ckpt/b/llama"}, xla_cache_root=tmp_path)
    assert a.xla_cache_path == a2.xla_cache_path  # stable across restarts
    assert a.xla_cache_path != b.xla_cache_path  # distinct per model
    assert a.xla_cache_path.parent == tmp_path
    assert model_slug("meta-llama/Llama-3.1-8B").startswith("Llama-3.1-8B-")
