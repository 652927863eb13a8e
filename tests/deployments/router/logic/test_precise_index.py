"""The precise index's speculative entries: a routed prompt counts as held until the engine's
events confirm it, a removal drops it or its TTL ends it."""

import pytest

from deployments.messages.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from deployments.router.logic.index_modes import make_prefix_index
from deployments.router.logic.precise_index import PrecisePrefixIndex
from tests.deployments.router.logic.test_prefix_index import ALL, SYSTEM, USER_A, USER_B, blocks


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def speculative_index(ttl_s: float = 2.0) -> tuple[PrecisePrefixIndex, Clock]:
    clock = Clock()
    idx = PrecisePrefixIndex(clock, speculative_ttl_s=ttl_s)
    for r in ALL:
        idx.add_replica(r, 100)
    return idx, clock


def test_precise_mode_holds_a_routed_prompt_speculatively_until_its_ttl():
    """Events arrive a poll after the dispatch: meanwhile the routed blocks count as held on the
    chosen replica (a sibling burst finds them), and they go if no event confirms them in time."""
    idx, clock = speculative_index(ttl_s=2.0)
    h = blocks(SYSTEM, USER_A)
    idx.on_routed("a", h)
    assert idx.match(h, ALL) == {"a": 6} and idx.num_speculative("a") == 6
    clock.now_s += 1.5
    idx.on_routed("a", h)  # a sibling, routed there too: refreshed to 1.5 + 2 s
    clock.now_s += 1.0  # past the first expiry, not the refreshed one
    assert idx.match(h, ALL) == {"a": 6}
    clock.now_s += 1.1
    assert idx.match(h, ALL) == {} and idx.num_speculative("a") == 0 and idx.num_blocks("a") == 0
    assert idx._owners == {}


def test_an_event_confirms_speculative_blocks_with_its_lane_and_removals_drop_them():
    idx, clock = speculative_index()
    h = blocks(SYSTEM, USER_A)
    idx.on_routed("a", h)
    idx.apply_events("a", [BlockStored(tuple(h[:4]), lane=1)])  # the engine stored the system prompt
    assert idx.num_speculative("a") == 2
    clock.now_s += 5  # the user turn was never confirmed: gone; the stored blocks stay
    assert idx.match(h, ALL) == {"a": 4}
    idx.apply_events("a", [BlockStored(tuple(h[:4]), lane=0), BlockRemoved(tuple(h[:4]), lane=1)])
    assert idx.match(h, ALL) == {"a": 4}  # lane 0 now (the confirmed entry has real lanes)
    # A removal or a clear drops speculative entries at once.
    idx.on_routed("b", h)
    idx.apply_events("b", [BlockRemoved((h[2],))])
    assert idx.match(h, ALL)["b"] == 2 and idx.num_speculative("b") == 5
    idx.on_routed("c", h)
    idx.apply_events("c", [AllBlocksCleared()])
    assert "c" not in idx.match(h, ALL) and idx.num_speculative("c") == 0


def test_blocks_the_engine_reported_are_not_made_speculative():
    idx, clock = speculative_index()
    h = blocks(SYSTEM, USER_A)
    idx.apply_events("a", [BlockStored(tuple(h[:4]), lane=1)])
    idx.on_routed("a", h)  # only the user turn is a guess
    assert idx.num_speculative("a") == 2
    clock.now_s += 5
    assert idx.match(h, ALL) == {"a": 4}
    idx.apply_events("a", [BlockRemoved(tuple(h[:4]), lane=1)])  # its lane survived the dispatch
    assert idx.match(h, ALL) == {}


def test_speculative_entries_off_and_reset_by_a_snapshot():
    idx, _ = speculative_index(ttl_s=0.0)
    h = blocks(SYSTEM, USER_A)
    idx.on_routed("a", h)
    assert idx.match(h, ALL) == {} and idx.num_speculative("a") == 0
    idx, clock = speculative_index()
    idx.on_routed("a", h)
    idx.apply_snapshot("a", h[:3])  # a router resync: the engine's truth replaces the guesses
    assert idx.num_speculative("a") == 0 and idx.match(h, ALL) == {"a": 3}
    clock.now_s += 5
    assert idx.match(h, ALL) == {"a": 3}
    idx.on_routed("b", h)
    idx.remove_replica("b")
    clock.now_s += 5
    assert idx.match(h, ALL) == {"a": 3}  # the expiry of a removed replica's entries is a no-op
    assert make_prefix_index("precise", clock, 2.0).match(h, ALL) == {}


def test_speculative_entries_never_push_out_a_block_the_engine_reported():
    """The engine does not report a block it still holds again, so a confirmed entry evicted to
    make room for a guess would be lost until the engine evicted and re-stored it."""
    clock = Clock()
    idx = PrecisePrefixIndex(clock, speculative_ttl_s=2.0)
    idx.add_replica("a", 6)  # the engine's capacity: 6 blocks
    h = blocks(SYSTEM, USER_A)
    idx.apply_events("a", [BlockStored(tuple(h))])
    other = blocks(USER_B, USER_B)
    idx.on_routed("a", other)  # 4 guesses on top of a full replica
    assert idx.match(h, {"a"}) == {"a": 6} and idx.match(other, {"a"}) == {"a": 4}
    clock.now_s += 3
    assert idx.match(h, {"a"}) == {"a": 6} and idx.match(other, {"a"}) == {}
    assert idx.num_blocks("a") == 6


TIER_CREDIT = {"device": 1.0, "host": 0.8, "storage": 0.3}


def test_blocks_on_a_slower_tier_are_held_and_credited_below_device_blocks():
    """A prefix the device evicted but the host tier keeps still matches (the engine loads it
    back), credited at the host's rate; loaded back it is a device hit again; dropped by the last
    tier it is gone."""
    idx, _ = speculative_index(ttl_s=0.0)
    h = blocks(SYSTEM, USER_A)  # 6 blocks
    idx.apply_events("a", [BlockStored(tuple(h))])
    idx.apply_events("b", [BlockStored(tuple(h[:4]))])
    idx.apply_events("a", [BlockStored(tuple(h[2:]), tier="host")])  # device evicted blocks 2..5
    assert idx.match(h, ALL) == {"a": 6, "b": 4}
    assert idx.credit(h, idx.match(h, ALL), TIER_CREDIT) == {"a": pytest.approx(2 + 4 * 0.8), "b": 4.0}
    assert idx.tier_of("a", h[1]) == "device" and idx.tier_of("a", h[5]) == "host" and idx.tier_of("c", h[0]) is None
    idx.apply_events("a", [BlockStored(tuple(h[4:]), tier="storage")])
    assert idx.credit(h, idx.match(h, ALL), TIER_CREDIT)["a"] == pytest.approx(2 + 2 * 0.8 + 2 * 0.3)
    idx.apply_events("a", [BlockStored(tuple(h[2:4]))])  # loaded back onto the device
    assert idx.credit(h, idx.match(h, ALL), TIER_CREDIT)["a"] == pytest.approx(4 + 2 * 0.3)
    idx.apply_events("a", [BlockRemoved(tuple(h[4:]))])
    assert idx.match(h, ALL)["a"] == 4 and idx._tiers["a"] == {}
    # A clear forgets the tiers with the blocks.
    idx.apply_events("b", [BlockStored(tuple(h[:4]), tier="host"), AllBlocksCleared()])
    assert "b" not in idx.match(h, ALL) and idx._tiers["b"] == {}


def test_blocks_held_only_on_a_slower_tier_ride_on_top_of_the_device_bound():
    """The LRU bound is the engine's device capacity: host-tier blocks (whose count the engine
    does not report) never push out a device block it still holds."""
    idx = PrecisePrefixIndex()
    idx.add_replica("a", 4)
    device = blocks(SYSTEM)  # 4 blocks: the device is full
    offloaded = blocks(USER_A, USER_B)  # 4 more, only on the host
    idx.apply_events("a", [BlockStored(tuple(offloaded)), BlockStored(tuple(offloaded), tier="host")])
    idx.apply_events("a", [BlockStored(tuple(device))])
    assert idx.match(device, {"a"}) == {"a": 4} and idx.match(offloaded, {"a"}) == {"a": 4}
    assert idx.num_blocks("a") == 8


def test_the_device_bound_never_evicts_an_off_device_block_and_off_device_blocks_have_their_own():
    """A device overflow (a lost removal) drops the oldest *device* block even when older
    host-tier blocks sit before it; a new host-tier block never pushes out a device block; and
    off-device blocks stop at ``TIER_BOUND_FACTOR`` device capacities, oldest first."""
    from deployments.router.logic.precise_index import TIER_BOUND_FACTOR

    idx = PrecisePrefixIndex()
    idx.add_replica("a", 2)
    runs = [blocks(list(range(1000 * k, 1000 * k + 4))) for k in range(4)]  # one block each
    idx.apply_events("a", [BlockStored(tuple(runs[0]), tier="host")])  # oldest: host only
    idx.apply_events("a", [BlockStored(tuple(runs[1])), BlockStored(tuple(runs[2]))])  # device full
    idx.apply_events("a", [BlockStored(tuple(runs[3]))])  # a third device block: one must go
    assert idx.tier_of("a", runs[0][0]) == "host" and idx.tier_of("a", runs[1][0]) is None
    assert idx.tier_of("a", runs[2][0]) == "device" and idx.tier_of("a", runs[3][0]) == "device"
    offloaded = [blocks(list(range(50_000 + 4 * k, 50_004 + 4 * k))) for k in range(TIER_BOUND_FACTOR * 2 + 1)]
    for run in offloaded:
        idx.apply_events("a", [BlockStored(tuple(run), tier="host")])
    assert idx.tier_of("a", runs[2][0]) == "device" and idx.tier_of("a", runs[3][0]) == "device"
    assert len(idx._tiers["a"]) == TIER_BOUND_FACTOR * 2 and idx.tier_of("a", runs[0][0]) is None
    assert idx.tier_of("a", offloaded[1][0]) == "host"


def test_a_snapshot_restores_each_blocks_tier():
    """After a router restart the snapshot's off-device blocks are credited at their tier's rate
    and ride on top of the device bound, as when they came as events."""
    idx = PrecisePrefixIndex()
    idx.add_replica("a", 2)
    h = blocks(SYSTEM)  # 4 blocks: 2 on the device, 2 only on the host
    idx.apply_snapshot("a", h, tiers=((h[2], "host"), (h[3], "host")))
    assert idx.match(h, {"a"}) == {"a": 4}
    assert idx.credit(h, {"a": 4}, TIER_CREDIT)["a"] == pytest.approx(2 + 2 * 0.8)
