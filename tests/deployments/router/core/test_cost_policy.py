from deployments.router.core.policies import make_policy
from serve_app.config.router import CostWeights

from .policy_helpers import context

WEIGHTS = CostWeights(w_prefill=1.0, w_load_blocks=4.0, window_abs=8.0, window_rel=0.25)


def choose(*args, **kwargs):
    return make_policy("prefix+session+load", WEIGHTS).choose(context(*args, **kwargs))


def test_best_prefix_wins_within_the_load_window():
    choice = choose({"a": 5, "b": 0, "c": 0}, {"a": 80, "b": 10})
    assert (choice.replica_id, choice.reason) == ("a", "prefix")  # 20 + 4*5 < 90


def test_imbalance_falls_back_without_losing_all_affinity():
    # "a" holds the most but is overloaded (outside min + 8); among the acceptable replicas the
    # better prefix ("b") still beats the idlest one ("c").
    choice = choose({"a": 20, "b": 4, "c": 0, "d": 1}, {"a": 90, "b": 60, "c": 0})
    assert (choice.replica_id, choice.reason) == ("b", "prefix")


def test_load_cost_outweighs_a_small_prefix_gain():
    choice = choose({"a": 6, "b": 0}, {"a": 5})  # saves 5 blocks, costs 24 in load
    assert (choice.replica_id, choice.reason) == ("b", "load")


def test_cold_miss_goes_by_load_and_spreads_ties():
    assert choose({"a": 2, "b": 0, "c": 1}).replica_id == "b"
    idle = {f"r{i}": 0 for i in range(8)}
    picks = {choose(idle, tie_key=key).replica_id for key in range(100)}
    assert len(picks) == 8  # not always the "smallest" or the first replica
    assert choose(idle, tie_key=42).replica_id == choose(idle, tie_key=42).replica_id


def test_session_sticks_spills_at_cap_and_moves_when_overloaded():
    assert choose({"a": 3, "b": 0}, {"b": 90}, session="a").reason == "session"
    choice = choose({"a": 1, "b": 0, "c": 0}, {"a": 90, "b": 40}, session="a", can_stick=False)
    assert (choice.replica_id, choice.reason, choice.rebind_session) == ("b", "spill", False)
    choice = choose({"a": 30, "b": 0, "c": 1}, {"a": 90, "c": 40}, session="a")
    assert (choice.replica_id, choice.reason, choice.rebind_session) == ("c", "overloaded", True)


def test_fresh_engine_queue_counts_as_load():
    # Same prefix on both; "a" reports a long wait queue, so "b" is cheaper.
    choice = choose({"a": 0, "b": 1}, {"a": 50, "b": 50}, stats={"a": (6, 0.0)})
    assert choice.replica_id == "b"
