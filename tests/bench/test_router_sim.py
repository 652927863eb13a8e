"""The router simulator on a small trace: it runs, its figures are coherent, and the ordering the
design relies on holds (cache-aware beats cache-blind on hits; the default does not collapse)."""

import json
import math
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
sys.path.insert(0, os.path.abspath(BENCH))

import ray_prefix_affinity  # noqa: E402
import router_sim  # noqa: E402
from router_sim_cluster import EngineCache  # noqa: E402


def test_small_run_prints_one_coherent_json_object(capsys):
    router_sim.main(
        [
            "--json",
            "--no-latency",
            "--replicas",
            "4",
            "--kv-blocks",
            "256",
            "--sessions",
            "24",
            "--turns",
            "4",
            "--groups",
            "6",
            "--shared-requests",
            "200",
            "--duration-s",
            "30",
            "--group-system-tokens",
            "512",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    entries = out["policies"]
    assert set(entries) == set(router_sim.ENTRIES)
    for name, entry in entries.items():
        assert entry["policy"] == name
        assert 0.0 <= entry["hit_rate"] <= 1.0
        assert entry["max_over_mean_load"] >= 1.0
        assert math.isclose(entry["hit_ratio_vs_oracle"], entry["hit_rate"] / out["oracle_hit_rate"], rel_tol=1e-2)
    assert entries["prefix+session+load"]["hit_rate"] > entries["round_robin"]["hit_rate"]
    assert entries["prefix"]["hit_rate"] > entries["least_loaded"]["hit_rate"]
    # no collapse: all on one of 4 replicas would read 4.0; load awareness evens out pure prefix routing
    for name in ("prefix+session+load", "prefix+session+load@precise"):
        assert entries[name]["max_over_mean_load"] < 2.0
        assert entries[name]["max_over_mean_load"] < entries["prefix"]["max_over_mean_load"]


def test_the_decision_latency_path_drives_the_core_with_route_requests(capsys):
    """The latency measurement (not its figures): every timed decision goes through
    ``RouterCore.choose``/``on_dispatched`` on a preloaded index."""
    small = ["--sessions", "8", "--turns", "2", "--groups", "2", "--shared-requests", "40", "--duration-s", "10"]
    latency = ["--latency-replicas", "4", "--latency-cached-blocks", "200", "--latency-decisions", "30"]
    policies = ["--policies", "prefix+session+load,prefix+session+load@precise"]
    router_sim.main(["--json", "--replicas", "4", "--kv-blocks", "128", *small, *latency, *policies])
    entries = json.loads(capsys.readouterr().out)["policies"]
    for entry in entries.values():
        assert entry["latency_num_timed"] == 30 and entry["latency_preloaded_blocks"] >= 200


def test_engine_cache_reports_stores_and_evictions_in_order():
    cache = EngineCache(3)
    assert [type(e).__name__ for e in cache.store([1, 2])] == ["BlockStored"]
    events = cache.store([3, 4])  # 4 blocks > 3: the least recent (block 2, a tail) goes
    assert [type(e).__name__ for e in events] == ["BlockRemoved", "BlockStored"]
    assert events[0].block_hashes == (2,) and events[1].block_hashes == (3, 4)
    assert cache.num_cached_prefix([1, 2]) == 1


def test_char_tree_longest_match_and_smallest_tree_fallback():
    peer = ray_prefix_affinity.RayPrefixAffinityPeer(["a", "b"], seed=0)
    idle = {"a": 0, "b": 0}
    peer.on_routed("system prompt, question one", "a", 0.0)
    assert peer.choose("system prompt, question two", idle) == "a"
    assert peer.tree.prefix_match("system prompt, q", ["a", "b"]) == (16, ["a"])
    assert peer.choose("unrelated text", idle) == "b"  # miss: smallest tree
    peer.on_routed("system prompt, other", "b", 0.0)
    assert peer.tree.prefix_match("system prompt, other!", ["a", "b"]) == (20, ["b"])
    assert peer.tree.prefix_match("system prompt, ", ["a", "b"]) == (15, ["a", "b"])


@pytest.mark.parametrize("threshold", [10.0])
def test_imbalance_threshold_switches_to_power_of_two(threshold):
    peer = ray_prefix_affinity.RayPrefixAffinityPeer(["a", "b"], imbalanced_threshold=threshold, seed=0)
    peer.on_routed("shared prefix", "a", 0.0)
    assert peer.choose("shared prefix!", {"a": 11, "b": 0}) == "b"
    assert peer.choose("shared prefix!", {"a": 10, "b": 0}) == "a"


def test_several_router_replicas_split_the_decisions_and_agree_on_the_index():
    from router_sim_multi import MultiCoreSimRouter
    from router_sim_workload import WorkloadConfig, make_trace

    from accel.contract import EngineStats
    from deployments.router.kv_events import BlockStored
    from serve_app.config.router import CostWeights

    ids = ["a", "b", "c"]
    multi = MultiCoreSimRouter(3, "prefix+session+load", "precise", ids, 256, 16, CostWeights())
    trace = make_trace(
        WorkloadConfig(
            seed=1,
            block_size=16,
            duration_s=10,
            num_sessions=12,
            num_turns=2,
            num_groups=2,
            group_system_tokens=128,
            num_shared_requests=20,
        )
    )
    owners, sessions = set(), {}
    for i, req in enumerate(trace[:40]):
        replica = multi.choose(req, float(i))
        owner = multi._router_of[req.request_id]
        owners.add(owner)
        if req.session_id:  # every request of a session is decided by the same router replica
            assert sessions.setdefault(req.session_id, owner) == owner
        multi.on_kv_events(replica, [BlockStored(tuple(req.prompt_hashes))])
    assert len(owners) == 3  # the decisions are spread over every router replica
    # Every router follows every engine's events: identical precise indexes.
    probe = trace[0].prompt_hashes
    views = {name: r.core.index.match(probe, frozenset(ids)) for name, r in multi.routers.items()}
    assert len({tuple(sorted(v.items())) for v in views.values()}) == 1 and any(views.values())
    # Each router publishes its in-flight counts to the others (every 0.1 s of simulated time):
    # every router's foreign load on a replica is what the others have there.
    multi.on_stats("a", EngineStats(0, 0, 256, 256))
    multi._tick(1000.0)
    total = sum(r.core.num_in_flight("a") for r in multi.routers.values())
    for router in multi.routers.values():
        assert router.core.load("a").num_foreign_in_flight == total - router.core.num_in_flight("a")
    assert any(router.core.load("a").num_foreign_in_flight > 0 for router in multi.routers.values())
