import pytest

from deployments.config.router import SessionConfig
from deployments.messages.sessions import session_id_from
from deployments.router.logic.sessions import SessionTable


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def test_session_key_precedence():
    assert session_id_from({"X-Session-Id": "hdr"}, user="u", prompt_cache_key="p") == "hdr"
    assert session_id_from({"x-session-id": ""}, user="u", prompt_cache_key="p") == "u"
    assert session_id_from({}, user=None, prompt_cache_key="p") == "p"
    assert session_id_from(None) is None
    assert session_id_from({"other": "x"}, user="", prompt_cache_key="") is None


def test_sessions_stick_and_expire_after_idle_ttl():
    clock = Clock()
    table = SessionTable(SessionConfig(ttl_s=60.0), clock)
    table.on_dispatched("s1", "r1", rebind=False)
    table.on_finished("s1")
    clock.now_s += 59.0
    assert table.bound_replica("s1") == "r1"  # still within TTL
    table.on_dispatched("s1", "r2", rebind=False)  # a spill does not move the binding
    table.on_finished("s1")
    assert table.bound_replica("s1") == "r1"
    clock.now_s += 59.0  # the last use refreshed the TTL
    assert table.bound_replica("s1") == "r1"
    clock.now_s += 2.0
    assert table.bound_replica("s1") is None
    assert len(table) == 0


def test_running_request_keeps_its_session_alive():
    clock = Clock()
    table = SessionTable(SessionConfig(ttl_s=10.0), clock)
    table.on_dispatched("long", "r1", rebind=False)
    table.on_dispatched("short", "r2", rebind=False)
    table.on_finished("short")
    clock.now_s += 30.0
    assert table.bound_replica("long") == "r1"
    assert table.bound_replica("short") is None


def test_in_flight_cap_and_rebind():
    table = SessionTable(SessionConfig(max_in_flight_per_session=2), Clock())
    assert table.can_stick("s")
    table.on_dispatched("s", "r1", rebind=False)
    table.on_dispatched("s", "r1", rebind=False)
    assert not table.can_stick("s")
    table.on_finished("s")
    assert table.can_stick("s")
    table.on_dispatched("s", "r3", rebind=True)  # its replica was overloaded: follow the request
    assert table.bound_replica("s") == "r3"
    table.on_finished("unknown")  # ignored


def test_removing_a_replica_unbinds_only_its_sessions():
    table = SessionTable(SessionConfig(), Clock())
    for i in range(6):
        table.on_dispatched(f"s{i}", f"r{i % 3}", rebind=False)
    assert table.remove_replica("r1") == 2
    assert [table.bound_replica(f"s{i}") for i in range(6)] == ["r0", None, "r2", "r0", None, "r2"]


def test_config_validation():
    with pytest.raises(ValueError):
        SessionConfig(ttl_s=0)
    with pytest.raises(ValueError):
        SessionConfig(max_in_flight_per_session=0)


def test_active_sessions_are_counted_per_replica_until_idle_for_active_s():
    clock = Clock()
    table = SessionTable(SessionConfig(ttl_s=600.0, active_s=30.0), clock)
    table.on_dispatched("s1", "r1", rebind=False)
    table.on_dispatched("s2", "r1", rebind=False)
    table.on_dispatched("s3", "r2", rebind=False)
    assert dict(table.num_active()) == {"r1": 2, "r2": 1}
    table.on_finished("s1")
    clock.now_s += 20.0
    table.on_finished("s2")  # s2 used again at +20 s
    clock.now_s += 15.0  # s1 and s3 idle 35 s, s2 15 s
    assert dict(table.num_active()) == {"r1": 1}
    assert table.bound_replica("s1") == "r1"  # inactive is not unbound: the TTL is 600 s
    table.on_dispatched("s1", "r1", rebind=False)  # back: active again
    assert dict(table.num_active()) == {"r1": 2}


def test_active_counts_follow_rebinds_removals_and_expiry():
    clock = Clock()
    table = SessionTable(SessionConfig(ttl_s=10.0, active_s=30.0), clock)
    table.on_dispatched("s1", "r1", rebind=False)
    table.on_dispatched("s1", "r2", rebind=False)  # a cap spill: binding and count stay on r1
    assert dict(table.num_active()) == {"r1": 1}
    table.on_dispatched("s1", "r2", rebind=True)  # overloaded: the session moves
    assert dict(table.num_active()) == {"r2": 1}
    table.on_dispatched("s2", "r3", rebind=False)
    table.remove_replica("r3")
    assert dict(table.num_active()) == {"r2": 1}
    for _ in range(3):
        table.on_finished("s1")
    clock.now_s += 11.0  # past the TTL (shorter than active_s here): unbound, so not active
    assert dict(table.num_active()) == {}
    assert len(table) == 0
