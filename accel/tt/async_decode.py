"""Depth-2 in-flight queue: overlap the host's work with the mesh's decode compute.

A device-sampled decode (no logprobs, async scheduling on, tracing on) is left in flight: the
engine applies the previous step's tokens (detokenize, stops, deltas) and schedules the next step
while the mesh computes. The next decode's input tokens are the in-flight step's sampled tokens
(``PENDING_TOKEN`` rows, fed by slot): the queue finalizes that step and feeds them just before
submitting. Anything else drains: a prefill (prefill is synchronous), host sampling, logprobs, or
an empty plan.

A changed batch layout (a request joins or leaves) does not drain, as vLLM's async scheduling
does not: a row keeps its slot for its whole life, so a continuing row's pending token is the
in-flight step's token in the same slot, and a joining row's first input comes from the host.
(The runner still signals the changed layout for that step: ``reset_batch`` to a version-0 class,
a full input reload with sampling reset to a version-1 one; ``accel.tt.decode_contract``.)
Draining there held every other row's token back by one device step at each join and leave: a
gap of two steps, the p99 gap of a decode replica that requests keep joining (PD's decode side).

``execute(plan)`` returns the (plan, result) pairs that completed, oldest first; at most two
steps are ever outstanding (the one being applied and the one computing).
"""

from __future__ import annotations

from accel.tt.runner import MeshRunner, PendingStep, StepResult
from accel.tt.step_plan import StepMode, StepPlan

Completed = list[tuple[StepPlan, StepResult]]


class AsyncDecodeQueue:
    def __init__(self, runner: MeshRunner, is_enabled: bool):
        self.runner = runner
        self.is_enabled = is_enabled
        runner.read_back_async = is_enabled  # off: the plugin's synchronous read-back
        self._inflight: PendingStep | None = None
        self.num_overlapped_steps = 0

    @property
    def has_inflight(self) -> bool:
        return self._inflight is not None

    @property
    def inflight_plan(self) -> StepPlan | None:
        """The plan of the step the mesh may still be computing (None when nothing is in flight)."""
        return None if self._inflight is None else self._inflight.plan

    def execute(self, plan: StepPlan) -> Completed:
        done: Completed = []
        prev, self._inflight = self._inflight, None
        if plan.mode is StepMode.EMPTY:
            if prev is not None:
                done.append((prev.plan, prev.finalize()))
            return done
        # Build the inputs while the previous step still computes; the critical path from its
        # completion to the next submission is only "copy its tokens into ours, dispatch".
        prepared = self.runner.prepare(plan)
        if prev is not None and not plan.is_decode:
            prev.wait()  # prefill is synchronous: the mesh finishes the in-flight decode first
        pending = self.runner.launch(prepared, prev)
        if prev is not None:
            done.append((prev.plan, prev.finalize()))
        # A device-sampled step carries its own log probs (where the device serves them).
        if self.is_enabled and plan.is_decode and pending.is_device_sampled:
            self._inflight = pending
            self.num_overlapped_steps += 1
        else:
            done.append((plan, pending.finalize()))
        return done

    def drain(self) -> Completed:
        prev, self._inflight = self._inflight, None
        return [] if prev is None else [(prev.plan, prev.finalize())]

    def wait_idle(self) -> None:
        """Block until the in-flight step (if any) is done on the mesh; it stays queued."""
        if self._inflight is not None:
            self._inflight.wait()

    def reset(self) -> None:
        """Forget the in-flight step (after a failed step; its requests were aborted)."""
        self._inflight = None
