"""``eligible_pools`` places a request only on a pool whose engine serves its task: embeddings on
vLLM's pooling runner, generation anywhere else; a pinned pool that cannot is a 400 naming
``model``, a model with no such pool a 404 (vLLM's server has no such route for it)."""

from __future__ import annotations

import dataclasses

import pytest

from accel.vllm.config import VllmEngineConfig
from deployments.messages.routing import RouteRequest, RoutingError, eligible_pools
from tests.doubles.app_configs import pool_config


def _embed_pool(name, model):
    pool = pool_config(name, model, "vllm")
    config = dataclasses.replace(pool.engine_config, extra_args={"runner": "pooling", "convert": "embed"})
    assert isinstance(config, VllmEngineConfig)
    return dataclasses.replace(pool, engine_config=config)


POOLS = (pool_config("tt", "m"), pool_config("gen", "m", "vllm"), _embed_pool("emb", "m"), _embed_pool("e2", "e"))


def test_each_task_goes_to_the_pools_that_serve_it():
    assert [p.name for p in eligible_pools(RouteRequest("r", "m", 3), POOLS)] == ["tt", "gen"]
    assert [p.name for p in eligible_pools(RouteRequest("r", "m", 3, task="embed"), POOLS)] == ["emb"]
    assert [p.name for p in eligible_pools(RouteRequest("r", "e", 3, task="embed"), POOLS)] == ["e2"]


def test_a_model_without_a_pool_for_the_task_is_404():
    with pytest.raises(RoutingError) as err:
        eligible_pools(RouteRequest("r", "e", 3), POOLS)  # chat/completions to an embedding model
    assert (err.value.status, err.value.param) == (404, "model")
    with pytest.raises(RoutingError) as err:
        eligible_pools(RouteRequest("r", "g", 3, task="embed"), (pool_config("g", "g"),))
    assert (err.value.status, err.value.param) == (404, "model")


def test_a_pinned_pool_that_cannot_is_400_naming_model():
    with pytest.raises(RoutingError) as err:
        eligible_pools(RouteRequest("r", "m", 3, pool="tt", task="embed"), POOLS)
    assert (err.value.status, err.value.param) == (400, "model")
    with pytest.raises(RoutingError) as err:
        eligible_pools(RouteRequest("r", "m", 3, pool="emb"), POOLS)
    assert (err.value.status, err.value.param) == (400, "model")
    assert [p.name for p in eligible_pools(RouteRequest("r", "m", 3, pool="emb", task="embed"), POOLS)] == ["emb"]
