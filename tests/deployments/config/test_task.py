"""Which requests a pool serves, from its engine args as vLLM spells them."""

from __future__ import annotations

from accel.tt.config import TTEngineConfig
from accel.vllm.config import VllmEngineConfig
from deployments.config.task import pool_tasks


def _vllm(**extra):
    return VllmEngineConfig(model="/m", extra_args=extra or None)


def test_generative_pools():
    assert pool_tasks(TTEngineConfig(model="/m")) == {"generate"}
    assert pool_tasks(_vllm()) == {"generate"}
    assert pool_tasks(_vllm(runner="generate")) == {"generate"}


def test_pooling_runner_serves_embeddings():
    assert pool_tasks(_vllm(runner="pooling")) == {"embed"}
    assert pool_tasks(_vllm(runner="pooling", convert="embed")) == {"embed"}
    assert pool_tasks(_vllm(convert="embed")) == {"embed"}


def test_a_classifier_serves_neither():
    assert pool_tasks(_vllm(runner="pooling", convert="classify")) == frozenset()
