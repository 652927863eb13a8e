"""TTEngineConfig: vLLM spellings, refusals with their messages."""

from __future__ import annotations

import pytest

from accel.contract import ConfigError
from accel.tt.config import TTEngineConfig, check_model_capabilities
from accel.tt.mesh_model import SUPPORTS_ASYNC_DECODE, SUPPORTS_PREFIX_CACHING


def build(**args):
    return TTEngineConfig.from_engine_args({"model": "/nonexistent", **args})


def test_vllm_spelled_args_and_tt_options():
    cfg = build(
        max_num_seqs=8,
        max_model_len=512,
        data_parallel_size=4,
        block_size=32,
        enable_prefix_caching=True,
        async_scheduling=True,
        max_num_batched_tokens=256,
        num_gpu_blocks_override=100,
        seed=3,
        tensor_parallel_size=1,
        served_model_name="x",
        additional_config={
            "tt": {
                "sample_on_device_mode": "decode_only",
                "trace_mode": "decode_only",
                "enable_model_warmup": False,
                "fabric_config": "FABRIC_1D_RING",
                "fabric_reliability_mode": "RELAXED_INIT",
                "dispatch_core_axis": "col",
                "worker_l1_size": 1344544,
                "trace_region_size": 220000000,
                "l1_small_size": 79104,
                "always_compat_sampling": False,
                "optimizations": "accuracy",
            }
        },
    )
    assert cfg.num_lanes == 4 and cfg.max_num_seqs_global == 32
    assert cfg.max_num_blocks_per_req == 16
    assert cfg.tt.sample_on_device_mode == "decode_only" and cfg.tt.dispatch_core_axis == "col"


def test_max_model_len_defaults_to_the_checkpoint(tiny_llama):
    cfg = TTEngineConfig.from_engine_args({"model": str(tiny_llama)})
    assert cfg.max_model_len == 4096


@pytest.mark.parametrize(
    "args, message",
    [
        ({"bogus_arg": 1}, "bogus_arg: unknown engine arg"),
        ({"additional_config": {"tt": {"bogus_tt": 1}}}, "additional_config.tt.bogus_tt: unknown key"),
        ({"additional_config": {"other": {}}}, "additional_config.other: unknown key"),
        (
            {"tensor_parallel_size": 2},
            "tensor_parallel_size=2: not supported on a TT mesh; the mesh shape expresses it",
        ),
        (
            {"pipeline_parallel_size": 2},
            "pipeline_parallel_size=2: not supported on a TT mesh; the mesh shape expresses it",
        ),
        ({"speculative_config": {"method": "ngram"}}, "speculative_config: speculative decoding is not supported"),
        ({"enable_lora": True}, "enable_lora: LoRA is not supported"),
        ({"prompt_logprobs": 1}, "prompt_logprobs: prompt logprobs are not supported"),
        ({"max_num_seqs": 0}, "max_num_seqs: expected an integer >= 1"),
        (
            {"additional_config": {"tt": {"sample_on_device_mode": "sometimes"}}},
            "additional_config.tt.sample_on_device_mode: expected one of all, decode_only",
        ),
        ({"additional_config": {"tt": {"trace_mode": "x"}}}, "additional_config.tt.trace_mode: expected one of"),
        (
            {"num_gpu_blocks_override": 2, "max_model_len": 1024, "block_size": 64},
            "num_gpu_blocks_override: 2 blocks of 64 tokens per lane cannot hold one max_model_len",
        ),
    ],
)
def test_refusals_name_the_key(args, message):
    with pytest.raises(ConfigError) as info:
        build(**args)
    assert message in str(info.value)


def test_harmless_off_values_of_refused_args_pass():
    build(enable_lora=False, speculative_config=None, tensor_parallel_size=1, pipeline_parallel_size=1)


def test_model_capability_checks():
    on = build(enable_prefix_caching=True, async_scheduling=True)
    check_model_capabilities(on, {SUPPORTS_PREFIX_CACHING: True, SUPPORTS_ASYNC_DECODE: True})
    with pytest.raises(ConfigError, match="enable_prefix_caching: the model does not declare supports_prefix_caching"):
        check_model_capabilities(on, {SUPPORTS_ASYNC_DECODE: True})
    with pytest.raises(ConfigError, match="async_scheduling: the model does not declare supports_async_decode"):
        check_model_capabilities(on, {SUPPORTS_PREFIX_CACHING: True})
    check_model_capabilities(build(), {})  # defaults ask nothing of the model
