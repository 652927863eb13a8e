"""AdapterTable (pure): LoRA slots per replica (``max_loras`` distinct adapters in flight), the
adapters a replica holds (in flight or recently routed, up to ``max_loras``), and the affinity
credit they give in the policy's cost."""

from __future__ import annotations

from deployments.router.logic.adapters import ADAPTER_HIT_BLOCKS, AdapterTable


def _table(**max_loras: int) -> AdapterTable:
    table = AdapterTable()
    for replica_id, n in max_loras.items():
        table.add_replica(replica_id, n)
    return table


def test_replicas_without_lora_are_never_placeable():
    table = _table(tt=0, v=2)
    assert table.placeable("a", ["tt", "v"]) == {"v"}
    assert table.placeable("a", ["tt"]) == frozenset()


def test_a_replica_with_its_slots_taken_by_other_adapters_is_left_out_while_another_has_room():
    table = _table(r0=2, r1=2)
    table.on_dispatched("x", "a", ["r0"])
    table.on_dispatched("y", "b", ["r0"])
    assert table.num_running("r0") == 2
    assert table.placeable("c", ["r0", "r1"]) == {"r1"}  # r0's two slots run a and b
    assert table.placeable("a", ["r0", "r1"]) == {"r0", "r1"}  # a runs on r0 already: no new slot
    table.on_dispatched("z", "c", ["r1"])
    table.on_dispatched("w", "d", ["r1"])
    assert table.placeable("e", ["r0", "r1"]) == {"r0", "r1"}  # all full: queue anywhere capable
    table.on_finished("y")
    assert table.placeable("e", ["r0", "r1"]) == {"r0"}  # b finished: a slot is free on r0


def test_a_replica_holding_the_adapter_is_credited_like_a_prefix_hit():
    table = _table(r0=1, r1=1)
    table.on_dispatched("x", "a", ["r0"])
    table.on_finished("x")  # no longer running, still loaded (most recently used)
    assert table.holds("r0", "a") and not table.holds("r1", "a")
    assert table.credit("a", {"r1": 3}, ["r0", "r1"]) == {"r0": ADAPTER_HIT_BLOCKS, "r1": 3}
    assert table.credit("b", {"r1": 3}, ["r0", "r1"]) == {"r1": 3}


def test_loaded_adapters_are_bounded_by_max_loras_least_recently_used_out():
    table = _table(r0=2)
    for i, adapter in enumerate(["a", "b", "a", "c"]):
        table.on_dispatched(f"q{i}", adapter, ["r0"])
        table.on_finished(f"q{i}")
    assert [x for x in "abc" if table.holds("r0", x)] == ["a", "c"]  # b was least recently used


def test_removed_replicas_and_unknown_requests_are_forgotten():
    table = _table(r0=1)
    table.on_dispatched("x", "a", ["r0", "gone"])
    table.remove_replica("r0")
    table.on_finished("x")
    table.on_finished("never-seen")
    assert not table.holds("r0", "a") and not table.can_run("r0")
