"""`make serve`'s step before `serve run`: free the ports a dead Ray session left held, or stop.

``python -m serve_app.launch.preflight CONFIG``: reads the config's HTTP port (and HAProxy's
stats and metrics ports when ``RAY_SERVE_ENABLE_HA_PROXY`` is on), stops the HAProxy of a dead
Ray session that holds any of them (saying so in one line), and exits 1 with one line naming
the port and its holder when anything else holds one (a live Ray, another program), touching
nothing. Then it prints where the Ray dashboard is and how to sign in.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from accel.envs import ENVS
from serve_app.launch.dashboard_banner import dashboard_banner
from serve_app.launch.port_holder import decide
from serve_app.launch.process_table import listeners, process_table, stop

# Serve's default HTTP port when the config's http_options leave it out.
SERVE_DEFAULT_PORT = 8000


def config_port(config_file: Path) -> int:
    doc = yaml.safe_load(config_file.read_text()) or {}
    return int((doc.get("http_options") or {}).get("port", SERVE_DEFAULT_PORT))


def needed_ports(config_file: Path) -> dict[str, int]:
    ports = {"the config's HTTP port": config_port(config_file)}
    if ENVS.ray_serve_haproxy:
        ports["HAProxy's stats port"] = ENVS.ray_serve_haproxy_stats_port
        ports["HAProxy's metrics port"] = ENVS.ray_serve_haproxy_metrics_port
    return ports


def free_ports(config_file: Path) -> str | None:
    """Stop a dead session's leftovers on the needed ports; the one line why not, else None."""
    ports = needed_ports(config_file)
    holders = {port: listeners(port) for port in set(ports.values())}
    if not any(holders.values()):
        return None
    verdict = decide(ports, holders, process_table())
    if verdict.blocked is not None:
        return verdict.blocked
    for record in verdict.to_stop:
        stop(record)
    pids = ", ".join(str(r.pid) for r in verdict.to_stop)
    print(f"preflight: stopped a dead Ray session's HAProxy (pid {pids}) left on port(s) {_ports(ports, holders)}")
    return None


def _ports(ports: dict[str, int], holders: dict[int, set[int]]) -> str:
    return ", ".join(str(p) for p in sorted(set(ports.values())) if holders.get(p))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    args = parser.parse_args(argv)
    blocked = free_ports(args.config)
    if blocked is not None:
        print(f"make serve: {blocked}", file=sys.stderr)
        return 1
    print("\n".join(dashboard_banner(ENVS.ray_auth_mode, ENVS.ray_auth_token_path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
