"""Stop vLLM's engine processes when the process that owns them dies without stopping them.

vLLM's ``AsyncLLM`` runs its ``EngineCore`` in a child process, which runs the workers in children
of its own, and stops them in ``shutdown()``. The workers watch the engine core (a death pipe), but
nothing watches the owner: a Serve replica killed without its graceful shutdown (Ray's SIGKILL
after ``graceful_shutdown_timeout_s``, ``ray stop --force`` while Serve is still shutting down,
the OOM killer) leaves the engine core and its workers running as orphans, holding their memory
(GBs on a real model) and ports.

``OrphanGuard`` starts a small watcher process (``python -m accel.vllm.orphan_guard``) that blocks
reading a pipe whose only write end the owner holds. The kernel closes that end when the owner
exits, however it exits, so the watcher wakes then, or when the owner closes the guard after
its own shutdown, and stops every process it was given that is still the same process (same pid
and start time, so a reused pid is never signalled): SIGTERM first (vLLM's handler stops its
workers), SIGKILL for what is left after a grace period. The watcher runs in a session of its
own, so the signals that stop the owner's process group do not stop it before it acts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

GRACE_S = 5.0  # between SIGTERM and SIGKILL; vLLM's engine core stops its workers within this


@dataclass(frozen=True)
class ProcessId:
    """A process, told apart from a later one reusing its pid by its start time."""

    pid: int
    create_time: float

    def encode(self) -> str:
        return f"{self.pid}:{self.create_time!r}"

    @staticmethod
    def decode(text: str) -> ProcessId:
        pid, create_time = text.split(":", 1)
        return ProcessId(int(pid), float(create_time))

    def alive(self) -> psutil.Process | None:
        """The process if it still runs as the same process (not a zombie), else None."""
        try:
            proc = psutil.Process(self.pid)
            if proc.create_time() != self.create_time or proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except psutil.Error:
            return None


def descendant_pids() -> set[int]:
    """Pids of this process's descendants now."""
    return {child.pid for child in psutil.Process().children(recursive=True)}


def new_descendants(before: set[int]) -> list[ProcessId]:
    """This process's descendants whose pids were not in ``before`` (what a call just started),
    except multiprocessing's resource tracker: it serves this whole process, ignores SIGTERM, and
    exits by itself once nothing holds its pipe."""
    from multiprocessing import resource_tracker

    tracker_pid = getattr(resource_tracker._resource_tracker, "_pid", None)
    found = []
    for child in psutil.Process().children(recursive=True):
        if child.pid not in before and child.pid != tracker_pid:
            try:
                found.append(ProcessId(child.pid, child.create_time()))
            except psutil.Error:  # exited meanwhile
                continue
    return found


class OrphanGuard:
    """Stops ``processes`` when this process exits or ``close()`` is called, whichever is first."""

    def __init__(self, processes: Sequence[ProcessId]) -> None:
        self.processes = tuple(processes)
        package_root = str(Path(__file__).resolve().parents[2])  # the folder holding ``accel``
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        # Popen's pipe ends are close-on-exec and close_fds is on: the owner's write end is the only
        # one, so nothing the owner starts later can keep the watcher waiting after the owner is gone.
        self._watcher = subprocess.Popen(
            [sys.executable, "-m", __name__, *(p.encode() for p in self.processes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )

    @property
    def watcher_pid(self) -> int:
        return self._watcher.pid

    def close(self, timeout_s: float = GRACE_S + 5.0) -> None:
        """The owner's own shutdown is done: the watcher stops whatever it left running and exits.
        Idempotent."""
        if self._watcher.stdin is not None and not self._watcher.stdin.closed:
            self._watcher.stdin.close()
        try:
            self._watcher.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._watcher.kill()


def stop_processes(processes: Iterable[ProcessId], grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM every process still running as itself, SIGKILL what survives ``grace_s``; the pids
    that were signalled."""
    running = [p for p in processes if p.alive() is not None]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in running:
            proc = p.alive()
            if proc is not None:
                try:
                    proc.send_signal(sig)
                except psutil.Error:
                    continue
        if not _wait_gone(running, grace_s):
            break
    return [p.pid for p in running]


def _wait_gone(processes: Sequence[ProcessId], timeout_s: float) -> list[ProcessId]:
    """Those of ``processes`` still running after ``timeout_s`` (a zombie counts as gone: an
    orphan's exit status waits for init to reap it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in processes if p.alive() is not None]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def _watch(argv: Sequence[str]) -> None:
    processes = [ProcessId.decode(a) for a in argv]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the pipe ends the wait
    while sys.stdin.buffer.read(4096):  # EOF: the owner closed the guard or is gone
        pass
    stop_processes(processes)


if __name__ == "__main__":
    _watch(sys.argv[1:])
