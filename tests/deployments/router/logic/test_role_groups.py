"""``RoleGroups``: a model's replicas by role, in one sorted order, narrowed for pinned or retried
requests (no disaggregation then)."""

from __future__ import annotations

from deployments.router.logic.role_groups import RoleGroups


def test_groups_stay_sorted_and_an_emptied_group_is_gone():
    groups = RoleGroups()
    for key, replica in [(("m", "both"), "r2"), (("m", "both"), "r1"), (("m", "prefill"), "p1")]:
        groups.add(key, replica)
    assert groups.members(("m", "both")) == ("r1", "r2")
    assert groups.member_set(("m", "both"), frozenset({"r2", "x"})) == {"r2"}
    groups.discard(("m", "prefill"), "p1")
    groups.discard(("m", "prefill"), "p1")  # idempotent
    assert groups.members(("m", "prefill")) is None
    assert groups.by_role("m", None) == (None, None, ("r1", "r2"))


def test_an_allowed_set_rules_out_disaggregation():
    groups = RoleGroups()
    for key, replica in [(("m", "prefill"), "p"), (("m", "decode"), "d1"), (("m", "decode"), "d2")]:
        groups.add(key, replica)
    assert groups.by_role("m", None) == (("p",), ("d1", "d2"), None)
    assert groups.by_role("m", frozenset({"d2", "p"})) == (None, ("d2",), ())
