import pytest

from accel.contract import ConfigError
from deployments.config.router import CostWeights
from deployments.router.logic.policies import make_policy, policy_names
from deployments.router.logic.policy import load_view, tie_rank, without

from .policy_helpers import context


def test_policies_by_name():
    assert set(policy_names()) == {"round_robin", "least_loaded", "prefix", "session", "prefix+session+load"}
    for name in policy_names():
        assert make_policy(name).name == name


def test_unknown_policy_name_is_a_clear_config_error():
    with pytest.raises(ConfigError) as err:
        make_policy("cache_aware")
    message = str(err.value)
    assert "router.policy" in message and "'cache_aware'" in message and "prefix+session+load" in message


def test_negative_weight_is_a_config_error():
    with pytest.raises(ConfigError, match="w_prefill"):
        CostWeights(w_prefill=-1)


def test_load_view_uses_fresh_stats_and_window():
    weights = CostWeights(w_queue=1.0, w_kv_usage=4.0, window_abs=2.0, window_rel=0.5)
    view = load_view(context({"a": 1, "b": 6, "c": 2}, stats={"c": (3, 0.5)}), weights)
    assert view.scores == {"a": 1.0, "b": 6.0, "c": 7.0}
    assert view.min_score == 1.0 and view.limit == 3.0
    assert view.is_acceptable("a") and not view.is_acceptable("b")
    view = load_view(context({"a": 10, "b": 16}), weights)
    assert view.limit == 15.0  # relative part wins at higher load
    # Other routers' requests weigh like ours, whatever w_queue is.
    view = load_view(context({"a": 1, "b": 2}, foreign={"a": 5}), CostWeights(w_queue=0.0))
    assert view.scores == {"a": 6.0, "b": 2.0}


def test_tie_rank_spreads_keys_deterministically():
    replicas = [f"r{i}" for i in range(8)]
    ctx = context({r: 0 for r in replicas})
    winners = {min(replicas, key=lambda r: tie_rank(key, ctx.replica_hashes[r])) for key in range(200)}
    assert len(winners) == 8  # different prompts spread over every replica
    assert tie_rank(5, 9) == tie_rank(5, 9)


def test_without_keeps_a_lone_candidate():
    assert without(("a", "b"), "a") == ("b",)
    assert without(("a",), "a") == ("a",)
