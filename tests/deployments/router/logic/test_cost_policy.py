import dataclasses

from deployments.config.router import CostWeights
from deployments.router.logic.policies import make_policy

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
    assert choose({"a": 3, "b": 0}, {"a": 40, "b": 40}, session="a").reason == "session"
    assert choose({"a": 3, "b": 0}, session="a").reason == "session"  # nothing cached anywhere
    # At the cap with little of the prompt on the bound replica: the load term moves the request.
    choice = choose({"a": 3, "b": 0, "c": 0}, {"a": 10, "b": 8}, session="a", can_stick=False)
    assert (choice.replica_id, choice.reason, choice.rebind_session) == ("b", "spill", False)
    choice = choose({"a": 30, "b": 0, "c": 1}, {"a": 90, "c": 40}, session="a")
    assert (choice.replica_id, choice.reason, choice.rebind_session) == ("c", "overloaded", True)


def test_a_session_yields_when_another_replica_holds_more_of_its_prompt():
    """The bound replica's engine evicted the session's history (KV pressure) and keeps only the
    shared system prompt, or less than another replica: the request goes by cost, and the
    binding follows it when it lands elsewhere; where the bound replica is still the cheapest
    the request stays and so does the binding."""
    choice = choose({"a": 3, "b": 0}, {"b": 90}, session="a")
    assert (choice.replica_id, choice.reason, choice.rebind_session) == ("b", "yield", True)
    choice = choose({"a": 3, "b": 0}, {"a": 10, "b": 12}, session="a")  # 12 - 10 < 4 * 3 in load
    assert (choice.replica_id, choice.reason, choice.rebind_session) == ("b", "yield", True)
    choice = choose({"a": 0, "b": 3}, {"a": 10, "b": 12}, session="a")  # 2 blocks < 4 * 3 in load
    assert (choice.replica_id, choice.reason, choice.rebind_session) == ("a", "session", False)
    # A replica holding more but overloaded (outside min + 8) does not make the session yield to a
    # third one holding nothing.
    choice = choose({"a": 0, "b": 20, "c": 0}, {"a": 5, "b": 10}, session="a")
    assert (choice.replica_id, choice.reason) == ("a", "session")


def test_a_sibling_at_the_session_cap_stays_where_the_shared_history_is():
    # An agent's fan-out: three sub-requests over the session's 90-block history, the session at
    # its cap on "a" (two siblings in flight). Leaving saves 4 * 2 in load but recomputes 90
    # blocks on "b" (cost a = 4*2 - 90 < b = 0 - 0): the sibling stays, the binding too.
    choice = choose({"a": 2, "b": 0}, {"a": 90}, session="a", can_stick=False)
    assert (choice.replica_id, choice.reason, choice.rebind_session) == ("a", "sibling", False)
    # The window still rules: a bound replica overloaded (in flight 10 > 0 + 8) is left.
    choice = choose({"a": 10, "b": 0}, {"a": 90}, session="a", can_stick=False)
    assert (choice.replica_id, choice.reason, choice.rebind_session) == ("b", "overloaded", True)


def test_fresh_engine_queue_counts_as_load():
    # Same prefix on both; "a" reports a long wait queue, so "b" is cheaper.
    choice = choose({"a": 0, "b": 1}, {"a": 50, "b": 50}, stats={"a": (6, 0.0)})
    assert choice.replica_id == "b"


def test_a_new_session_counts_the_sessions_active_on_each_replica():
    # A popular system prompt (24 blocks) cached on "a" only, one request in flight each side.
    # Cost = 4 * (in flight + 2 * active sessions) - matched (w_session 2): with 9 sessions active
    # on "a" and 1 on "b", a = 4*19 - 24 = 52 > b = 4*3 = 12, so the new session binds to "b";
    # with 3 vs 2, a = 4*7 - 24 = 4 < b = 4*5 = 20, and the prefix still wins.
    skewed = {"a": 9, "b": 1}
    choice = choose({"a": 1, "b": 1}, {"a": 24}, active_sessions=skewed, new_session=True)
    assert (choice.replica_id, choice.reason) == ("b", "load")
    even = {"a": 3, "b": 2}
    assert choose({"a": 1, "b": 1}, {"a": 24}, active_sessions=even, new_session=True).replica_id == "a"
    # The same request when it is not a new session (sessionless, or a bound session's spill)
    # goes by present load only: the prefix wins.
    assert choose({"a": 1, "b": 1}, {"a": 24}, active_sessions=skewed).replica_id == "a"


def test_active_sessions_never_widen_or_narrow_the_load_window():
    # "b" has no active sessions but is overloaded (in flight 10 > 0 + 8): never chosen.
    choice = choose({"a": 0, "b": 10}, {"a": 24}, active_sessions={"a": 30}, new_session=True)
    assert choice.replica_id == "a"


def test_a_nearly_full_kv_cache_turns_the_session_term_off():
    # Mean fresh KV usage 0.95 >= session_max_kv_usage (0.9): a copy of the prompt would evict
    # someone's history, so the session gathers where its prefix is, as without the term.
    full = {"a": (0, 0.95), "b": (0, 0.95)}
    skewed = {"a": 9, "b": 1}
    args = ({"a": 1, "b": 1}, {"a": 24})
    assert choose(*args, stats=full, active_sessions=skewed, new_session=True).replica_id == "a"
    roomy = {"a": (0, 0.5), "b": (0, 0.5)}
    assert choose(*args, stats=roomy, active_sessions=skewed, new_session=True).replica_id == "b"


def test_queued_prefill_blocks_count_as_load_in_the_cost_only():
    """Two replicas with one request each, equal prefixes: the one whose request still computes
    40 prompt blocks costs 40 * 0.25 = 10 more in load (40 blocks of prefill at 4 blocks per
    unit), so the other wins; at weight 0 (the default) the tie goes by the tie-break."""
    weights = CostWeights(w_prefill=1.0, w_load_blocks=4.0, window_abs=8.0, w_queued_prefill=0.25)
    policy = make_policy("prefix+session+load", weights)
    for tie_key in range(8):
        ctx = context({"a": 1, "b": 1}, {"a": 20, "b": 20}, tie_key=tie_key)
        queued = dataclasses.replace(ctx, queued_prefill_blocks={"a": 40})
        assert policy.choose(queued).replica_id == "b"
    # A bigger prefix still outweighs the queue: 50 blocks saved > 40 queued.
    ctx = dataclasses.replace(context({"a": 1, "b": 1}, {"a": 70, "b": 20}), queued_prefill_blocks={"a": 40})
    assert policy.choose(ctx).replica_id == "a"
    picks = {
        make_policy("prefix+session+load", WEIGHTS)
        .choose(dataclasses.replace(context({"a": 1, "b": 1}, tie_key=k), queued_prefill_blocks={"a": 40}))
        .replica_id
        for k in range(16)
    }
    assert picks == {"a", "b"}
