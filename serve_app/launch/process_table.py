"""The host's processes and who listens on which TCP port, read with psutil."""

from __future__ import annotations

import psutil

from serve_app.launch.port_holder import ProcessRecord


def _record(proc: psutil.Process) -> ProcessRecord | None:
    try:
        with proc.oneshot():
            return ProcessRecord(pid=proc.pid, ppid=proc.ppid(), name=proc.name(), cmdline=tuple(proc.cmdline()))
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def process_table() -> dict[int, ProcessRecord]:
    """Every process this user can read, by pid."""
    records = (_record(p) for p in psutil.process_iter())
    return {r.pid: r for r in records if r is not None}


def listeners(port: int) -> set[int]:
    """Pids listening on TCP ``port`` (any address); a listener whose owner cannot be read
    (another user's, without privileges) is reported as pid 0."""
    pids = set()
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            pids.add(conn.pid or 0)
    return pids


def stop(record: ProcessRecord, timeout_s: float = 5.0) -> None:
    """SIGTERM ``record``'s process, SIGKILL after ``timeout_s``; gone already is fine. psutil
    refuses to signal a reused pid (it checks the process's start time)."""
    try:
        proc = psutil.Process(record.pid)
        if tuple(proc.cmdline()) != record.cmdline:
            return  # the pid now names another process
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except psutil.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
    except psutil.NoSuchProcess:
        return
