"""Per-model tool / reasoning parser settings, spelled as vLLM spells them."""

from __future__ import annotations

import pytest

from accel.contract import ConfigError
from accel.vllm.config import VllmEngineConfig
from deployments.config.load import load_app_config


def _args(**model: object) -> dict:
    return {
        "models": [{"name": "m", "path": "/ckpt", "max_model_len": 256, **model}],
        "pools": [
            {"name": "tt", "engine": "tt", "accelerator": "cpu", "model": "m", "replicas": 1},
            {"name": "v", "engine": "vllm", "accelerator": "cpu", "model": "m", "replicas": 1},
        ],
    }


def test_parsers_in_the_model_block_reach_the_model_and_the_vllm_engine():
    config = load_app_config(
        _args(enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="qwen3"), "t.yaml"
    )
    (model,) = config.models
    assert model.parsing.enable_auto_tool_choice and model.parsing.tool_call_parser == "hermes"
    assert model.parsing.reasoning_parser == "qwen3" and model.parsing.tool_strict_level == "auto"
    assert model.parsing.has_parser
    tt, vllm = model.pools
    # vllm serve --reasoning-parser: the engine's structured outputs start after the reasoning.
    assert isinstance(vllm.engine_config, VllmEngineConfig)
    assert vllm.engine_config.engine_args(None, 1)["reasoning_parser"] == "qwen3"


def test_a_vllm_engine_serves_under_the_models_name():
    # vLLM labels its metrics (model_name) with served_model_name: the model's name, not the path.
    (model,) = load_app_config(_args(), "t.yaml").models
    _, vllm = model.pools
    assert vllm.engine_config.engine_args(None, 1)["served_model_name"] == "m"


def test_defaults_and_refusals():
    (model,) = load_app_config(_args(), "t.yaml").models
    assert not model.parsing.has_parser and model.parsing.tool_call_parser is None
    # A tool parser without auto tool choice builds no parser (as vllm serve).
    (model,) = load_app_config(_args(tool_call_parser="hermes"), "t.yaml").models
    assert not model.parsing.has_parser
    with pytest.raises(ConfigError, match="enable_auto_tool_choice requires tool_call_parser"):
        load_app_config(_args(enable_auto_tool_choice=True), "t.yaml")
    with pytest.raises(ConfigError, match="tool_strict_level"):
        load_app_config(_args(tool_strict_level="strictest"), "t.yaml")
