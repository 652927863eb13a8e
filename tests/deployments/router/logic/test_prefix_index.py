import os
import subprocess
import sys

import pytest

from accel.block_hash import hash_prompt_blocks
from accel.contract import ConfigError
from deployments.messages.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from deployments.router.logic.index_modes import make_prefix_index
from deployments.router.logic.precise_index import PrecisePrefixIndex
from deployments.router.logic.prefix_index import ApproximatePrefixIndex

BS = 4
ALL = frozenset({"a", "b", "c"})


def blocks(*token_runs: list[int]) -> list[int]:
    return hash_prompt_blocks([t for run in token_runs for t in run], BS)


SYSTEM = list(range(100, 116))  # 4 blocks
USER_A = list(range(200, 208))  # 2 blocks
USER_B = list(range(300, 308))


def test_index_keys_are_stable_across_processes():
    # Two router processes (or a router and an engine) must derive the same keys and the same
    # match from the same tokens, whatever Python's per-process hash salt is.
    code = (
        "from accel.block_hash import hash_prompt_blocks\n"
        "from deployments.router.logic.prefix_index import ApproximatePrefixIndex\n"
        "idx = ApproximatePrefixIndex()\n"
        "for r in ('a', 'b'): idx.add_replica(r, 100)\n"
        "h = hash_prompt_blocks(list(range(40)), 4)\n"
        "idx.on_routed('b', h[:7])\n"
        "print(h, sorted(idx.match(h, {'a', 'b'}).items()))\n"
    )
    outs = set()
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outs.add(
            subprocess.run(
                [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True, cwd=os.getcwd()
            ).stdout
        )
    assert len(outs) == 1
    assert "[('b', 7)]" in outs.pop()


def test_longest_prefix_per_replica_and_candidate_filter():
    idx = ApproximatePrefixIndex()
    for r in ALL:
        idx.add_replica(r, 100)
    idx.on_routed("a", blocks(SYSTEM, USER_A))
    idx.on_routed("b", blocks(SYSTEM))
    query = blocks(SYSTEM, USER_A, USER_B)
    assert idx.match(query, ALL) == {"a": 6, "b": 4}
    assert idx.match(query, frozenset({"b", "c"})) == {"b": 4}
    assert idx.match(blocks(USER_B), ALL) == {}
    assert idx.match([], ALL) == {}


def test_lru_mirrors_capacity_and_evicts_prompt_tails_first():
    idx = ApproximatePrefixIndex()
    idx.add_replica("a", 5)
    first = blocks(SYSTEM, USER_A)  # 6 blocks > capacity 5
    idx.on_routed("a", first)
    assert idx.num_blocks("a") == 5
    assert idx.holds("a", first[0]) and not idx.holds("a", first[-1])  # the tail went, not the head
    assert idx.match(first, ALL) == {"a": 5}
    other = blocks(USER_B)  # 2 new blocks push out 2 more, again from the old tail
    idx.on_routed("a", other)
    assert idx.num_blocks("a") == 5
    assert idx.match(first, ALL) == {"a": 3}
    assert idx.match(other, ALL) == {"a": 2}
    # Capacity shrinks on re-add: evicts down at once.
    idx.add_replica("a", 2)
    assert idx.num_blocks("a") == 2
    assert idx.num_cached_blocks == 2


def test_touching_refreshes_lru_order():
    idx = ApproximatePrefixIndex()
    idx.add_replica("a", 6)
    old, new = blocks(USER_A), blocks(USER_B)
    idx.on_routed("a", old)
    idx.on_routed("a", new)
    idx.on_routed("a", old)  # old is now the most recent
    idx.on_routed("a", blocks(SYSTEM))  # 4 more: 8 > 6, the two least recent (new) go
    assert idx.match(old, ALL) == {"a": 2}
    assert idx.match(new, ALL) == {}


def test_remove_replica_drops_every_block_at_once():
    idx = ApproximatePrefixIndex()
    for r in ALL:
        idx.add_replica(r, 100)
    h = blocks(SYSTEM)
    idx.on_routed("a", h)
    idx.on_routed("b", h)
    idx.remove_replica("a")
    idx.remove_replica("a")  # idempotent
    assert idx.match(h, ALL) == {"b": 4}
    assert idx.replicas() == ("b", "c")
    idx.remove_replica("b")
    assert idx._owners == {}  # no hash is left owned by a removed replica
    with pytest.raises(KeyError):
        idx.on_routed("a", h)


def test_precise_mode_follows_stored_and_evicted_events_only():
    idx = PrecisePrefixIndex()
    for r in ALL:
        idx.add_replica(r, 100)
    h = blocks(SYSTEM, USER_A)
    idx.on_routed("a", h)  # a routing decision alone is not a cache fact
    assert idx.match(h, ALL) == {}
    idx.apply_events("a", [BlockStored(tuple(h))])
    assert idx.match(h, ALL) == {"a": 6}
    idx.apply_events("a", [BlockRemoved(tuple(h[4:]))])  # the engine evicted the user turn
    assert idx.match(h, ALL) == {"a": 4}
    idx.apply_events("a", [BlockRemoved((h[1],))])  # a hole: the prefix now ends at block 1
    assert idx.match(h, ALL) == {"a": 1}
    idx.apply_events("b", [BlockStored(tuple(h)), AllBlocksCleared()])
    assert "b" not in idx.match(h, ALL)
    with pytest.raises(TypeError):
        idx.apply_events("a", ["not an event"])


def test_approximate_mode_ignores_engine_events():
    idx = ApproximatePrefixIndex()
    idx.add_replica("a", 100)
    h = blocks(SYSTEM)
    idx.apply_events("a", [BlockStored(tuple(h))])
    assert idx.match(h, ALL) == {}
    idx.on_routed("a", h)
    assert idx.match(h, ALL) == {"a": 4}


@pytest.mark.parametrize("mode", ["approximate", "precise"])
def test_snapshot_rebuilds_a_restarted_index(mode):
    before = make_prefix_index(mode)
    for r in ALL:
        before.add_replica(r, 100)
    contents = {"a": blocks(SYSTEM, USER_A), "b": blocks(SYSTEM), "c": blocks(USER_B)}
    for r, h in contents.items():
        if mode == "approximate":
            before.on_routed(r, h)
        else:
            before.apply_events(r, [BlockStored(tuple(h))])
    after = make_prefix_index(mode)  # the router restarted: empty
    for r in ALL:
        after.add_replica(r, 100)
        after.apply_snapshot(r, contents[r])
    for query in (blocks(SYSTEM, USER_A, USER_B), blocks(USER_B), blocks(SYSTEM)):
        assert after.match(query, ALL) == before.match(query, ALL)
    # A snapshot replaces, it does not add; and it respects capacity (LRU-first order).
    after.apply_snapshot("a", contents["c"])
    assert after.match(contents["a"], ALL) == {"b": 4}
    after.add_replica("c", 1)
    after.apply_snapshot("c", contents["c"])
    assert after.num_blocks("c") == 1 and after.holds("c", contents["c"][-1])


def test_unknown_index_mode_is_a_config_error():
    with pytest.raises(ConfigError, match="approximate, precise"):
        make_prefix_index("exact")
    with pytest.raises(ValueError):
        ApproximatePrefixIndex().add_replica("a", 0)


def test_galloping_match_equals_the_linear_walk_under_eviction():
    # Random prompts sharing random prefixes through small LRUs: the approximate index's
    # galloping lookup must agree with the exact block-by-block walk of the base class.
    import random

    from deployments.router.logic.prefix_index import PrefixIndex

    rng = random.Random(3)
    idx = ApproximatePrefixIndex()
    replicas = [f"r{i}" for i in range(5)]
    for r in replicas:
        idx.add_replica(r, rng.randint(8, 40))
    stems = [[rng.randrange(1000) for _ in range(rng.randint(4, 60))] for _ in range(6)]
    for step in range(400):
        stem = rng.choice(stems)
        tokens = stem[: rng.randint(0, len(stem))] + [rng.randrange(1000) for _ in range(rng.randint(0, 12))]
        h = hash_prompt_blocks(tokens, BS)
        cands = frozenset(rng.sample(replicas, rng.randint(1, 5)))
        assert idx.match(h, cands) == PrefixIndex.match(idx, h, cands), step
        idx.on_routed(rng.choice(replicas), h)


def test_precise_mode_matches_the_best_single_lane_of_a_replica():
    """Lanes of a TT replica are separate caches: a prompt is served from one lane, so the match
    is the longest prefix one lane holds, not what the lanes hold together."""
    idx = PrecisePrefixIndex()
    for r in ALL:
        idx.add_replica(r, 100)
    h = blocks(SYSTEM, USER_A)
    # lane 0 holds the system prompt only; lane 1 the system prompt and blocks 4-5 (its history)
    idx.apply_events("a", [BlockStored(tuple(h[:4]), lane=0), BlockStored(tuple(h[:6]), lane=1)])
    assert idx.match(h, ALL) == {"a": 6}
    idx.apply_events("a", [BlockRemoved((h[2],), lane=1)])  # lane 1 lost block 2: lane 0's 4 win
    assert idx.match(h, ALL) == {"a": 4}
    assert idx.holds("a", h[5])  # the union still holds it (lane 1 has it), uselessly
    # split across lanes: lane 0 holds 0-3, lane 1 holds 4-5 only -> one lane serves 4 blocks
    idx.apply_events("b", [BlockStored(tuple(h[:4]), lane=0), BlockStored(tuple(h[4:6]), lane=1)])
    assert idx.match(h, ALL)["b"] == 4
    idx.apply_events("b", [BlockRemoved(tuple(h[:4]), lane=0)])
    assert "b" not in idx.match(h, ALL)
    # the same block on two lanes stays until both evicted it
    idx.apply_events("c", [BlockStored(tuple(h[:2]), lane=0), BlockStored(tuple(h[:2]), lane=1)])
    idx.apply_events("c", [BlockRemoved(tuple(h[:2]), lane=0)])
    assert idx.match(h, ALL)["c"] == 2
    idx.apply_events("c", [BlockRemoved(tuple(h[:2]), lane=1)])
    assert "c" not in idx.match(h, ALL) and idx.num_blocks("c") == 0


def test_a_snapshot_has_unknown_lanes_counted_for_every_lane_until_a_lane_removes_them():
    idx = PrecisePrefixIndex()
    idx.add_replica("a", 100)
    h = blocks(SYSTEM, USER_A)
    idx.apply_events("a", [BlockStored(tuple(h[:2]), lane=1)])
    idx.apply_snapshot("a", h)  # the engine's union of lanes, lanes not said
    assert idx.match(h, {"a"}) == {"a": 6}
    idx.apply_events("a", [BlockStored((h[0],), lane=1), BlockRemoved((h[3],), lane=0)])
    # a removal on any lane drops an unknown-lane block: under-estimate, never over-estimate
    assert idx.match(h, {"a"}) == {"a": 3}
    idx.remove_replica("a")
    assert idx._owners == {} and "a" not in idx._lanes
