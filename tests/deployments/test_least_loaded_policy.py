"""The first routing policy, on fabricated replica loads (pure logic)."""

from __future__ import annotations

import pytest

from accel.contract import EngineStats
from deployments.least_loaded_policy import LeastLoadedPolicy, eligible_pools
from deployments.route_types import PoolInfo, ReplicaLoad, ReplicaSnapshot, RouteRequest, RoutingError

POOLS = (PoolInfo("tt", "m", "tt", "cpu", "both"), PoolInfo("vllm", "m", "vllm", "cpu", "both"),
         PoolInfo("pre", "m", "vllm", "tpu", "prefill"), PoolInfo("other", "m2", "tt", "cpu", "both"))


def _load(rid, pool, inflight, running=0, waiting=0, free=10):
    stats = EngineStats(num_waiting=waiting, num_running=running, num_kv_blocks_total=10, num_kv_blocks_free=free)
    return ReplicaLoad(rid, pool, inflight, ReplicaSnapshot(rid, pool, stats, inflight))


def test_eligible_pools_skip_prefill_only_and_other_models():
    assert [p.name for p in eligible_pools(RouteRequest("r", "m", 3), POOLS)] == ["tt", "vllm"]
    assert [p.name for p in eligible_pools(RouteRequest("r", "m", 3, pool="pre"), POOLS)] == ["pre"]


@pytest.mark.parametrize("pool, param", [("nope", "x-meshserve-pool"), ("other", "x-meshserve-pool")])
def test_bad_pins(pool, param):
    with pytest.raises(RoutingError) as err:
        eligible_pools(RouteRequest("r", "m", 3, pool=pool), POOLS)
    assert err.value.param == param


def test_least_loaded_wins_and_reported_load_counts():
    policy = LeastLoadedPolicy()
    loads = [_load("a", "tt", 3), _load("b", "tt", 0, running=5), _load("c", "vllm", 1)]
    assert policy.choose(RouteRequest("r", "m", 3), POOLS, loads) == ("vllm", "c")


def test_kv_pressure_breaks_ties():
    policy = LeastLoadedPolicy()
    loads = [_load("a", "tt", 1, free=1), _load("b", "vllm", 1, free=9)]
    assert policy.choose(RouteRequest("r", "m", 3), POOLS, loads)[1] == "b"


def test_equal_replicas_take_turns():
    policy = LeastLoadedPolicy()
    loads = [_load("a", "tt", 0), _load("b", "tt", 0)]
    picks = {policy.choose(RouteRequest("r", "m", 3), POOLS, loads)[1] for _ in range(4)}
    assert picks == {"a", "b"}


def test_pin_restricts_to_the_pool():
    policy = LeastLoadedPolicy()
    loads = [_load("a", "tt", 5), _load("b", "vllm", 0)]
    assert policy.choose(RouteRequest("r", "m", 3, pool="tt"), POOLS, loads) == ("tt", "a")


def test_no_known_replica_gives_pool_only():
    assert LeastLoadedPolicy().choose(RouteRequest("r", "m", 3, pool="vllm"), POOLS, []) == ("vllm", None)
