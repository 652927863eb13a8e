"""``eligible_pools`` places a LoRA adapter request only on pools that run adapters (vLLM pools
with enable_lora): never on a TT pool or a vLLM pool without it; a pin to such a pool is a 400
naming ``model``. Base-model requests still go to every pool."""

from __future__ import annotations

import dataclasses

import pytest

from accel.vllm.config import VllmEngineConfig
from deployments.messages.routing import RouteRequest, RoutingError, eligible_pools
from tests.doubles.app_configs import pool_config


def _lora_pool(name: str, model: str = "m", max_loras: int = 2):
    pool = pool_config(name, model, "vllm")
    config = dataclasses.replace(pool.engine_config, extra_args={"enable_lora": True, "max_loras": max_loras})
    assert isinstance(config, VllmEngineConfig)
    return dataclasses.replace(pool, engine_config=config)


POOLS = (pool_config("tt", "m"), pool_config("plain", "m", "vllm"), _lora_pool("lora"))


def test_an_adapter_request_goes_only_to_pools_that_run_adapters():
    assert [p.name for p in eligible_pools(RouteRequest("r", "m", 3, lora="a"), POOLS)] == ["lora"]
    assert [p.name for p in eligible_pools(RouteRequest("r", "m", 3), POOLS)] == ["tt", "plain", "lora"]
    assert [p.max_loras for p in POOLS] == [0, 0, 2]


@pytest.mark.parametrize("pin", ["tt", "plain"])
def test_an_adapter_request_pinned_to_a_pool_without_lora_is_a_400_naming_model(pin):
    with pytest.raises(RoutingError) as err:
        eligible_pools(RouteRequest("r", "m", 3, pool=pin, lora="a"), POOLS)
    assert (err.value.status, err.value.param) == (400, "model")
    assert f"pool {pin!r} cannot run LoRA adapter 'a'" in err.value.message
    assert [p.name for p in eligible_pools(RouteRequest("r", "m", 3, pool="lora", lora="a"), POOLS)] == ["lora"]


def test_a_model_without_a_lora_pool_refuses_an_adapter_by_model():
    with pytest.raises(RoutingError) as err:
        eligible_pools(RouteRequest("r", "m", 3, lora="a"), POOLS[:2])
    assert (err.value.status, err.value.param) == (400, "model")
