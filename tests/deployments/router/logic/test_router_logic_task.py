"""A model served by generative and pooling pools: the router places each request only on a
replica whose pool serves its task (embeddings on vLLM's pooling runner, generation elsewhere).
Models whose replicas all serve the task are routed as before (the other router tests)."""

from __future__ import annotations

import pytest

from deployments.router.logic.router_logic import NoReplicaError, ReplicaInfo

from .logic_helpers import SYSTEM, core_with, req


def _mixed():
    core = core_with(2)  # r0, r1: generative ("pool")
    core.add_replica(ReplicaInfo("e0", "embed", "m", 1000, tasks=frozenset({"embed"})))
    core.add_replica(ReplicaInfo("e1", "embed", "m", 1000, tasks=frozenset({"embed"})))
    return core


def test_each_task_goes_only_where_it_is_served():
    core = _mixed()
    generated = {core.route(req(f"g{i}", (i,) * 8)).replica_id for i in range(20)}
    embedded = {core.route(req(f"e{i}", (i,) * 8, task="embed")).replica_id for i in range(20)}
    assert generated == {"r0", "r1"} and embedded == {"e0", "e1"}


def test_a_pin_or_retry_keeps_to_the_task():
    core = _mixed()
    decision = core.route(req("e", SYSTEM, task="embed", excluded_replicas=("e0",)))
    assert decision.replica_id == "e1"
    with pytest.raises(NoReplicaError):
        core.route(req("x", SYSTEM, task="embed", pool="pool"))
