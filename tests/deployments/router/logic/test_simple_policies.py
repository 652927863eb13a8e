from deployments.router.logic.policies import make_policy

from .policy_helpers import context


def test_round_robin_cycles_over_candidates():
    policy = make_policy("round_robin")
    ctx = context({"a": 9, "b": 0, "c": 0})
    assert [policy.choose(ctx).replica_id for _ in range(4)] == ["a", "b", "c", "a"]


def test_least_loaded_counts_fresh_queue_and_kv():
    policy = make_policy("least_loaded")
    assert policy.choose(context({"a": 3, "b": 1, "c": 2})).replica_id == "b"
    choice = policy.choose(context({"a": 3, "b": 1, "c": 2}, stats={"b": (4, 0.0)}))
    assert choice.replica_id == "c" and choice.reason == "load"


def test_prefix_takes_the_longest_match_even_when_loaded():
    policy = make_policy("prefix")
    choice = policy.choose(context({"a": 50, "b": 0}, {"a": 10, "b": 3}))
    assert (choice.replica_id, choice.reason) == ("a", "prefix")
    assert policy.choose(context({"a": 50, "b": 0})).replica_id == "b"  # no match: by load


def test_session_sticks_until_overloaded_or_capped():
    policy = make_policy("session")
    assert policy.choose(context({"a": 3, "b": 0}, session="a")).replica_id == "a"
    choice = policy.choose(context({"a": 30, "b": 0}, session="a"))
    assert (choice.replica_id, choice.reason, choice.rebind_session) == ("b", "overloaded", True)
    choice = policy.choose(context({"a": 0, "b": 1, "c": 0}, session="a", can_stick=False))
    assert (choice.replica_id, choice.reason, choice.rebind_session) == ("c", "spill", False)
    assert policy.choose(context({"a": 3, "b": 0})).reason == "load"
