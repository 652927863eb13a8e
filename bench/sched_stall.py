"""How long this machine keeps a ready process waiting for a CPU while a benchmark round runs.

A server that saturates the 2-core machine delays everything else on it, the benchmark client
included: a client that is not scheduled reads its streams late, which shows up as TTFT and ITL
the server did not cause. ``StallProbe`` runs a separate, otherwise idle process next to the
client that sleeps ``period_s`` in a loop and records how much later than asked it woke up
(the oversleep): its percentiles say how starved a ready process was during the round, per
server, in the same run. (Measured 2 Dec: with our stack under ``vllm bench serve`` at C=16,
an independent sleep loop woke up to 1.4 s late while the client's own event loop lagged up to
2.3 s; with plain CPU burners on both cores the same loop never lagged more than 18 ms.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

# The child: sleep, note the oversleep, until stdin closes; then print the sorted oversleeps'
# percentiles as JSON. (Reading stdin in a thread keeps the sleep loop itself free of I/O.)
_CHILD = r"""
import json, sys, threading, time
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
period = float(sys.argv[1])
lags = []
while not done.is_set():
    t = time.monotonic()
    time.sleep(period)
    lags.append(time.monotonic() - t - period)
lags.sort()
pick = lambda q: round(1000 * lags[min(len(lags) - 1, int(q * len(lags)))], 1) if lags else 0.0
print(json.dumps({"p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": pick(1.0), "samples": len(lags)}))
"""


class StallProbe:
    """``start()`` before a round, ``stop()`` after it: the oversleep percentiles (ms) of a
    process that asked to sleep ``period_s`` at a time."""

    def __init__(self, period_s: float = 0.005):
        self._period_s = period_s
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(self._period_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    @property
    def pid(self) -> int | None:
        """The probe process while it runs."""
        return None if self._proc is None else self._proc.pid

    def stop(self) -> dict[str, Any]:
        proc, self._proc = self._proc, None
        if proc is None:
            raise RuntimeError("StallProbe.stop() without start()")
        out, _ = proc.communicate(input="", timeout=30)
        return dict(json.loads(out))
