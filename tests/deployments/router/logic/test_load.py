from accel.contract import EngineStats
from deployments.config.router import LoadConfig
from deployments.router.logic.load import LoadTracker


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def stats(num_waiting: int, free: int) -> EngineStats:
    return EngineStats(num_waiting=num_waiting, num_running=1, num_kv_blocks_total=100, num_kv_blocks_free=free)


def make() -> tuple[LoadTracker, Clock]:
    clock = Clock()
    tracker = LoadTracker(LoadConfig(stats_max_age_s=5.0), clock)
    for r in ("a", "b"):
        tracker.add_replica(r)
    return tracker, clock


def test_in_flight_counts_at_dispatch_and_releases_once():
    tracker, _ = make()
    tracker.on_dispatched("q1", ["a"])
    tracker.on_dispatched("q2", ["a"])
    assert tracker.num_in_flight("a") == 2
    tracker.on_finished("q1")
    tracker.on_finished("q1")  # error and cancel both reported: still one release
    tracker.on_finished("never-dispatched")
    assert tracker.num_in_flight("a") == 1
    assert tracker.num_requests_in_flight == 1


def test_disaggregated_request_releases_prefill_phase_first():
    tracker, _ = make()
    tracker.on_dispatched("q", ["b", "a"])  # decode on b, prefill on a
    tracker.on_phase_done("q", "a")
    assert (tracker.num_in_flight("a"), tracker.num_in_flight("b")) == (0, 1)
    tracker.on_finished("q")
    assert (tracker.num_in_flight("a"), tracker.num_in_flight("b")) == (0, 0)


def test_redispatching_an_id_does_not_double_count():
    tracker, _ = make()
    tracker.on_dispatched("q", ["a"])
    tracker.on_dispatched("q", ["b"])
    assert (tracker.num_in_flight("a"), tracker.num_in_flight("b")) == (0, 1)


def test_queued_prefill_blocks_count_while_their_request_or_phase_is_in_flight():
    tracker, _ = make()
    tracker.on_dispatched("q1", ["a"], {"a": 40})
    tracker.on_dispatched("q2", ["a"], {"a": 2})
    tracker.on_dispatched("pd", ["b", "a"], {"a": 10, "b": 0})  # decode on b, prefill on a
    assert dict(tracker.queued_prefill_blocks) == {"a": 52}
    tracker.on_phase_done("pd", "a")
    tracker.on_finished("q1")
    tracker.on_finished("q1")  # reported twice: released once
    assert dict(tracker.queued_prefill_blocks) == {"a": 2}
    tracker.on_dispatched("q2", ["b"], {"b": 7})  # re-dispatched: its first dispatch is released
    assert dict(tracker.queued_prefill_blocks) == {"a": 0, "b": 7}
    tracker.remove_replica("b")
    tracker.add_replica("b")  # the same id back (a later poll answered): q2 releases nothing there
    tracker.on_dispatched("q3", ["b"], {"b": 3})
    tracker.on_finished("q2")
    tracker.on_finished("pd")
    assert dict(tracker.queued_prefill_blocks) == {"a": 0, "b": 3} and tracker.num_requests_in_flight == 1


def test_stale_stats_are_ignored_but_in_flight_is_not():
    tracker, clock = make()
    tracker.on_dispatched("q", ["a"])
    tracker.apply_stats("a", stats(num_waiting=7, free=25))
    load = tracker.load("a")
    assert (load.num_in_flight, load.num_waiting, load.kv_usage, load.is_stats_fresh) == (1, 7, 0.75, True)
    assert tracker.fresh_stats() == {"a": (7, 0.75)}
    clock.now_s += 6.0
    load = tracker.load("a")
    assert (load.num_in_flight, load.num_waiting, load.kv_usage, load.is_stats_fresh) == (1, 0, 0.0, False)
    assert tracker.fresh_stats() == {}


def test_removed_replica_ignores_late_reports_and_releases():
    tracker, _ = make()
    tracker.on_dispatched("q", ["a"])
    tracker.remove_replica("a")
    tracker.apply_stats("a", stats(1, 50))
    tracker.on_finished("q")  # the dead replica's request ends later: no error, no count
    assert tracker.fresh_stats() == {}
    assert "a" not in tracker.in_flight


def test_fresh_stats_cache_follows_reports_and_expiry():
    tracker, clock = make()
    tracker.apply_stats("a", stats(1, 50))
    clock.now_s = 3.0
    tracker.apply_stats("b", stats(2, 0))
    assert tracker.fresh_stats() == {"a": (1, 0.5), "b": (2, 1.0)}
    clock.now_s = 5.5  # a's report (t=0) is stale now, b's (t=3) is not
    assert tracker.fresh_stats() == {"b": (2, 1.0)}
    tracker.apply_stats("a", stats(4, 100))
    assert tracker.fresh_stats() == {"a": (4, 0.0), "b": (2, 1.0)}
    tracker.remove_replica("b")
    assert tracker.fresh_stats() == {"a": (4, 0.0)}
    clock.now_s = 100.0
    assert tracker.fresh_stats() == {}


def test_other_routers_in_flight_counts_as_load_while_fresh():
    clock = Clock()
    tracker = LoadTracker(LoadConfig(stats_max_age_s=5.0), clock)
    for r in ("a", "b"):
        tracker.add_replica(r)
    tracker.on_dispatched("mine", ["a"])
    tracker.apply_stats("a", stats(0, 100), num_reported_in_flight=4)  # 3 of them are other routers'
    tracker.apply_stats("b", stats(0, 100), num_reported_in_flight=0)
    assert tracker.foreign_in_flight() == {"a": 3}
    assert tracker.load("a").num_foreign_in_flight == 3 and tracker.load("a").num_in_flight == 1
    tracker.apply_stats("b", stats(0, 100))  # no report: nothing foreign
    clock.now_s += 6.0  # stale: the foreign count goes with the snapshot
    assert tracker.foreign_in_flight() == {} and tracker.load("a").num_foreign_in_flight == 0


def test_fresh_peer_counts_replace_the_engine_derived_foreign_load():
    clock = Clock()
    tracker = LoadTracker(LoadConfig(stats_max_age_s=5.0, peer_max_age_s=1.0), clock)
    for r in ("a", "b"):
        tracker.add_replica(r)
    tracker.apply_stats("a", stats(0, 100), num_reported_in_flight=9)  # stale-ish: 9 foreign on a
    assert tracker.foreign_in_flight() == {"a": 9}
    tracker.apply_peer_in_flight("router-2", {"a": 2, "b": 1, "gone": 5})
    tracker.apply_peer_in_flight("router-3", {"b": 3, "a": 0})
    assert tracker.foreign_in_flight() == {"a": 2, "b": 4}  # peers' own counts win; unknown replicas dropped
    assert tracker.load("b").num_foreign_in_flight == 4
    tracker.apply_peer_in_flight("router-2", {"a": 1})  # a newer round replaces the older one
    assert tracker.foreign_in_flight() == {"a": 1, "b": 3}
    clock.now_s += 1.5  # peers went quiet (dead, or a single router again): back to engine stats
    assert tracker.foreign_in_flight() == {"a": 9}
