"""The shipped configs' engine choices: the real default model, and vLLM engine args as vLLM's
own parser reads them (unknown or ill-typed keys named with their file and pool)."""

import pytest

from accel.contract import ConfigError
from deployments.config.load import load_app_config
from tests.deployments.config.test_load import _args


def test_the_default_config_serves_the_real_model_with_a_real_context(checkpoint_dir):
    """configs/local.yaml (`make serve`): SmolLM2-135M-Instruct on both pools, 2,048 tokens each."""
    cfg = load_app_config(_args("local"))
    assert [m.name for m in cfg.models] == ["smollm2-135m-instruct"]
    assert cfg.models[0].path == checkpoint_dir / "smollm2-135m-instruct"
    assert cfg.models[0].max_model_len >= 2048
    assert {(p.engine, p.model) for p in cfg.pools} == {
        ("tt", "smollm2-135m-instruct"),
        ("vllm", "smollm2-135m-instruct"),
    }


def test_a_vllm_engine_arg_vllm_refuses_names_the_file_pool_and_key():
    args = _args()
    args["pools"][1]["engine_args"]["max_loras"] = "two"
    with pytest.raises(ConfigError, match=r"configs/tiny.yaml: pools\[1\].engine_args: max_loras: invalid int value"):
        load_app_config(args)


def test_the_speculative_config_reaches_the_engine_args():
    cfg = load_app_config(_args("speculative"))
    (pool,) = cfg.pools
    out = pool.engine_config.engine_args(None, tensor_parallel_size=1)
    assert out["speculative_config"] == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 3,
    }
