"""bench/process_group.py: a server gets a process group of its own (one ``killpg`` stops it and
everything it started) and stays in the benchmark's session unless asked otherwise."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from bench.process_group import popen_group_kwargs

# A server that starts a child of its own, as vLLM's API server starts its engine core.
SERVER = (
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "print(flush=True); time.sleep(60)"
)


def _alive(pid: int) -> bool:
    """Running (a killed process whose parent is gone may linger as a zombie until reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


@pytest.mark.parametrize("new_session", [False, True])
def test_the_server_leads_its_own_group_in_the_chosen_session(new_session: bool) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdout=subprocess.PIPE, **popen_group_kwargs(new_session=new_session)
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # the grandchild exists
        assert os.getpgid(proc.pid) == proc.pid
        assert os.getpgid(proc.pid) != os.getpgrp()
        if new_session:
            assert os.getsid(proc.pid) == proc.pid
        else:
            assert os.getsid(proc.pid) == os.getsid(0)
        (grandchild,) = _children(proc.pid)
        assert os.getpgid(grandchild) == proc.pid  # inherited: killpg reaches it

        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(grandchild)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
