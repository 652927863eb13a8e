"""The router simulator on a small trace: it runs, its figures are coherent, and the ordering the
design relies on holds (cache-aware beats cache-blind on hits; the default does not collapse)."""

import json
import math
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
sys.path.insert(0, os.path.abspath(BENCH))

import router_sim  # noqa: E402
from router_sim_cluster import EngineCache  # noqa: E402

SMALL = [
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
OURS = [name for name in router_sim.ENTRIES if not name.startswith("ray_")]


def test_small_run_prints_one_coherent_json_object(capsys):
    router_sim.main(["--policies", ",".join(OURS), *SMALL])
    out = json.loads(capsys.readouterr().out)
    entries = out["policies"]
    assert set(entries) == set(OURS)
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
    ``RouterLogic.choose``/``on_dispatched`` on a preloaded index."""
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


def test_several_router_replicas_split_the_decisions_and_agree_on_the_index():
    from router_sim_multi import MultiCoreSimRouter
    from router_sim_workload import WorkloadConfig, make_trace

    from accel.contract import EngineStats
    from deployments.config.router import CostWeights
    from deployments.messages.kv_events import BlockStored

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
    views = {name: r.logic.index.match(probe, frozenset(ids)) for name, r in multi.routers.items()}
    assert len({tuple(sorted(v.items())) for v in views.values()}) == 1 and any(views.values())
    # Each router publishes its in-flight counts to the others (every 0.1 s of simulated time):
    # every router's foreign load on a replica is what the others have there.
    multi.on_stats("a", EngineStats(0, 0, 256, 256))
    multi._tick(1000.0)
    total = sum(r.logic.num_in_flight("a") for r in multi.routers.values())
    for router in multi.routers.values():
        assert router.logic.load("a").num_foreign_in_flight == total - router.logic.num_in_flight("a")
    assert any(router.logic.load("a").num_foreign_in_flight > 0 for router in multi.routers.values())


def test_kv_events_reach_the_router_only_at_polls():
    """The deployment learns of an engine's blocks at its next poll (plus the event delay), so a
    precise router's index lags the engine; with instant delivery it does not."""
    from router_sim_cluster import ClusterConfig, simulate
    from router_sim_workload import WorkloadConfig, make_trace

    trace = make_trace(
        WorkloadConfig(
            seed=3,
            duration_s=5,
            num_sessions=4,
            num_turns=2,
            num_groups=1,
            group_system_tokens=64,
            num_shared_requests=6,
        )
    )

    class Recorder:
        def __init__(self):
            self.calls = []

        def choose(self, req, now_s):
            self.calls.append("choose")
            return "r0"

        def on_completed(self, req, now_s):
            self.calls.append("done")

        def on_kv_events(self, replica_id, events):
            self.calls.append("kv")

        def on_stats(self, replica_id, stats):
            self.calls.append("stats")

    polled, instant = Recorder(), Recorder()
    simulate(trace, ClusterConfig(num_replicas=1, kv_blocks_per_replica=64, block_size=16), polled, ["r0"])
    config = ClusterConfig(num_replicas=1, kv_blocks_per_replica=64, block_size=16, kv_events_at_poll=False)
    simulate(trace, config, instant, ["r0"])

    def followers(calls):  # what comes right after each KV delivery
        return {calls[i + 1] for i, c in enumerate(calls[:-1]) if c == "kv"}

    assert "kv" in polled.calls and "kv" in instant.calls
    assert followers(polled.calls) <= {"kv", "stats"}  # delivered in a poll, with the stats
    assert followers(instant.calls) & {"choose", "done"}  # delivered as they happen


@pytest.mark.slow
def test_ray_prefix_cache_affinity_router_is_rays_own_class(serve_session):
    """The peer is Ray's PrefixCacheAffinityRouter with its real tree actor: longest match wins,
    a miss goes to the smallest tree, and with a finite threshold an imbalance falls back to
    power of two (the least loaded of two)."""
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import PrefixCacheAffinityRouter
    from router_sim_ray import RaySimRouter

    class Req:
        def __init__(self, rid, text):
            self.request_id, self._text = rid, text

        def text(self):
            return self._text

    peer = RaySimRouter(["a", "b"], math.inf, seed=0)
    try:
        assert type(peer.router) is PrefixCacheAffinityRouter
        first = peer.choose(Req("1", "system prompt, question one"), 0.0)
        assert peer.choose(Req("2", "system prompt, question two"), 0.1) == first  # longest match
        other = "b" if first == "a" else "a"
        assert peer.choose(Req("3", "unrelated text entirely"), 0.2) == other  # miss: smallest tree
        assert peer.in_flight == {first: 2, other: 1}
        for rid in ("1", "2", "3"):
            peer.on_completed(Req(rid, ""), 1.0)
        assert peer.in_flight == {"a": 0, "b": 0}
    finally:
        peer.close()
    peer = RaySimRouter(["a", "b"], 10.0, seed=0)
    try:
        home = peer.choose(Req("0", "shared prefix"), 0.0)
        away = "b" if home == "a" else "a"
        peer.in_flight[home] = 10
        assert peer.choose(Req("y", "shared prefix, balanced enough"), 1.0) == home  # 10 - 0: affinity
        peer.in_flight[home] = 12
        assert peer.choose(Req("x", "shared prefix, imbalanced"), 2.0) == away  # 12 - 0 > 10: power of two
    finally:
        peer.close()


def test_validation_candidate_is_chosen_on_the_tuning_family_and_judged_elsewhere():
    import router_sim_validate as v

    def fam(default, best, grid):
        return {"default": {"hit_ratio_vs_oracle": default}, "best": {"hit_ratio_vs_oracle": best}, "grid": grid}

    results = {
        # on tuning, 4/32/0.25 is the best point within the load bound (16/2/1 has more hits, load 1.3)
        "tuning": fam(0.90, 0.95, {"4/8/0.25": (0.90, 1.1), "4/32/0.25": (0.95, 1.2), "16/2/1": (0.99, 1.3)}),
        "held_a": fam(0.80, 0.82, {"4/8/0.25": (0.80, 1.1), "4/32/0.25": (0.81, 1.1), "16/2/1": (0.82, 1.2)}),
        "held_b": fam(0.70, 0.70, {"4/8/0.25": (0.70, 1.0), "4/32/0.25": (0.60, 1.0), "16/2/1": (0.5, 1.0)}),
    }
    out = v.candidate_report(results, "tuning", ["held_a", "held_b"], max_regret=0.02)
    assert out["weights"] == {"w_load_blocks": 4.0, "window_abs": 32.0, "window_rel": 0.25}
    assert out["families"]["held_a"]["ok"] and out["families"]["held_a"]["regret"] == 0.01
    assert not out["families"]["held_b"]["ok"] and out["families"]["held_b"]["vs_default"] == -0.1
    assert not out["held_out_ok"]
