"""LoRA modules in the model config: vLLM's --lora-modules spellings, what a pool can run, the
checks naming file and key, and model-name resolution to (model, adapter)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from accel.contract import ConfigError
from deployments.config.load import load_app_config
from deployments.config.lora import LoraModule, parse_lora_module

CONFIG = Path(__file__).parents[3] / "configs" / "lora.yaml"


def _args() -> dict:
    return yaml.safe_load(CONFIG.read_text())["applications"][0]["args"]


def test_both_vllm_spellings_parse_as_vllm_reads_them(tmp_path):
    assert parse_lora_module("a=/x/y") == LoraModule("a", "/x/y")
    assert parse_lora_module('{"name": "b", "path": "/p", "base_model_name": "m"}') == LoraModule("b", "/p", "m")
    assert parse_lora_module({"name": "c", "path": "/q"}) == LoraModule("c", "/q")
    assert parse_lora_module("d=~/z").path == str(Path("~/z").expanduser())
    with pytest.raises(ConfigError, match="Invalid JSON format for --lora-modules"):
        parse_lora_module("not json, no equals")
    with pytest.raises(ConfigError, match="Invalid fields"):
        parse_lora_module({"name": "e", "path": "/p", "rank": 8})


def test_the_example_config_declares_two_adapters_on_its_lora_pool(tiny_lora_adapters):
    cfg = load_app_config(_args())
    (model,) = cfg.models
    assert [a.name for a in model.lora_modules] == ["tiny-llama-lora-a", "tiny-llama-lora-b"]
    assert [Path(a.path) for a in model.lora_modules] == list(tiny_lora_adapters)
    assert {p.name: p.max_loras for p in cfg.pools} == {"tt": 0, "vllm": 2}
    assert cfg.resolve_model("tiny-llama") == (model, None)
    assert cfg.resolve_model("tiny-llama-lora-b") == (model, model.lora_modules[1])
    assert cfg.resolve_model("nope") is None


def test_enable_lora_without_max_loras_is_vllms_default_of_one():
    args = copy.deepcopy(_args())
    del args["pools"][1]["engine_args"]["max_loras"]
    assert load_app_config(args).pools[1].max_loras == 1


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda a: a["pools"][1]["engine_args"].pop("enable_lora"), "none of its pools sets engine_args.enable_lora"),
        (lambda a: a["models"][0]["lora_modules"].append("tiny-llama-lora-a=/tmp"), "duplicate LoRA module name"),
        (lambda a: a["models"][0]["lora_modules"].append("tiny-llama=/tmp"), "conflicts with the served base model"),
        (lambda a: a["models"][0]["lora_modules"].append("c=/nonexistent"), "has no adapter_config.json"),
    ],
)
def test_bad_lora_modules_name_the_file_and_key(change, problem):
    args = copy.deepcopy(_args())
    change(args)
    with pytest.raises(ConfigError) as err:
        load_app_config(args)
    assert str(err.value).startswith("configs/lora.yaml: models[0].lora_modules: ") and problem in str(err.value)


def test_an_adapter_named_like_another_model_is_refused():
    args = copy.deepcopy(_args())
    other = copy.deepcopy(args["models"][0])
    other.update(name="tiny-llama-lora-a", lora_modules=[])
    args["models"].append(other)
    pool = copy.deepcopy(args["pools"][0])
    pool.update(name="tt2", model="tiny-llama-lora-a")
    args["pools"].append(pool)
    with pytest.raises(ConfigError, match="'tiny-llama-lora-a' is already a served name"):
        load_app_config(args)


def test_a_declared_adapter_over_max_lora_rank_is_refused_as_vllm_refuses_it(tmp_path, tiny_lora_adapters):
    config = json.loads((tiny_lora_adapters[0] / "adapter_config.json").read_text())
    (tmp_path / "adapter_config.json").write_text(json.dumps({**config, "r": 16}))
    args = copy.deepcopy(_args())
    args["models"][0]["lora_modules"].append(f"big={tmp_path}")
    with pytest.raises(ConfigError, match="LoRA rank 16 is greater than max_lora_rank 8"):
        load_app_config(args)
    args["pools"][1]["engine_args"]["max_lora_rank"] = 16
    assert load_app_config(args).models[0].lora_modules[-1].name == "big"
