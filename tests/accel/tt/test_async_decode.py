"""AsyncDecodeQueue: what stays in flight, what drains, and token feeding."""

from __future__ import annotations

from accel.contract import SamplingParams
from accel.tt.async_decode import AsyncDecodeQueue
from accel.tt.mesh_model import SUPPORTS_DEVICE_PENALTIES, SUPPORTS_SAMPLE_ON_DEVICE
from accel.tt.runner import PendingStep, StepResult
from accel.tt.sampling_policy import SamplingPolicy
from accel.tt.step_plan import PENDING_TOKEN, RowPlan, StepMode, StepPlan


class FakeRunner:
    """Submits nothing; each step's token for a row = 100 * step_id + row. Records feeding."""

    def __init__(self):
        # a class without device penalties: a penalized row samples on the host
        self.policy = SamplingPolicy("all", False, {SUPPORTS_SAMPLE_ON_DEVICE: True, SUPPORTS_DEVICE_PENALTIES: False})
        self.submitted: list[tuple[int, dict | None]] = []
        self.finalized: list[int] = []

    def prepare(self, plan):
        return plan

    def launch(self, plan, prev=None):
        fed = None
        if any(r.input_token_ids[-1] == PENDING_TOKEN for r in plan.rows):
            fed = prev.finalize().tokens_by_row(prev.plan)
        self.submitted.append((plan.step_id, fed))
        use_device = self.policy.use_device(plan)

        def result(_):
            self.finalized.append(plan.step_id)
            return StepResult(tuple(100 * plan.step_id + r.row for r in plan.rows), None, use_device)

        return PendingStep(plan, lambda: None, result, use_device)


def plan(step_id, rows=(0, 1), mode=StepMode.DECODE, pending=True, **sp):
    params = SamplingParams(temperature=0, **sp)
    token = (PENDING_TOKEN,) if pending else (5,)
    return StepPlan(
        step_id, mode, 4, 1, tuple(RowPlan(f"r{r}", 0, r, 10, 11, token, (0,), True, params, 0) for r in rows)
    )


def ids(done):
    return [p.step_id for p, _ in done]


def row(r, pending=True):
    token = (PENDING_TOKEN,) if pending else (5,)
    return RowPlan(f"r{r}", 0, r, 10, 11, token, (0,), True, SamplingParams(temperature=0), 0)


def test_device_sampled_decode_keeps_one_step_in_flight_and_feeds_its_tokens():
    runner = FakeRunner()
    q = AsyncDecodeQueue(runner, is_enabled=True)
    assert ids(q.execute(plan(1, pending=False))) == [] and q.has_inflight  # in flight at once
    assert q.inflight_plan is not None and q.inflight_plan.step_id == 1
    done = q.execute(plan(2))
    assert ids(done) == [1] and q.has_inflight
    assert runner.submitted[-1] == (2, {0: 100, 1: 101})  # step 1's tokens feed step 2
    assert runner.submitted[0] == (1, None)
    assert ids(q.drain()) == [2] and not q.has_inflight and q.inflight_plan is None
    assert q.num_overlapped_steps == 2


def test_a_request_joining_or_leaving_does_not_drain():
    """Rows keep their slots: when row 2 joins (its first input from the host) and row 1 leaves,
    row 0's pending token still comes from the in-flight step's slot 0, and nothing waits."""
    runner = FakeRunner()
    q = AsyncDecodeQueue(runner, is_enabled=True)
    q.execute(plan(1, rows=(0, 1), pending=False))
    joined = StepPlan(2, StepMode.DECODE, 4, 1, (row(0), row(1), row(2, pending=False)))
    assert ids(q.execute(joined)) == [1] and q.has_inflight  # step 1 done, step 2 computing
    assert runner.submitted[-1] == (2, {0: 100, 1: 101})
    left = StepPlan(3, StepMode.DECODE, 4, 1, (row(0), row(2)))  # row 1 finished
    assert ids(q.execute(left)) == [2] and q.has_inflight
    assert runner.submitted[-1] == (3, {0: 200, 1: 201, 2: 202})  # slot 0 and slot 2 fed from step 2
    assert ids(q.drain()) == [3]
    assert q.num_overlapped_steps == 3


def test_prefill_logprobs_host_sampling_and_empty_drain():
    runner = FakeRunner()
    q = AsyncDecodeQueue(runner, is_enabled=True)
    q.execute(plan(1, pending=False))
    assert ids(q.execute(plan(2, rows=(0,), logprobs=1))) == [1, 2] and not q.has_inflight
    q.execute(plan(3, rows=(0,), pending=False))
    assert q.has_inflight
    assert ids(q.execute(plan(4, rows=(0,), presence_penalty=0.5))) == [3, 4]  # host sampling
    q.execute(plan(5, rows=(0,), pending=False))
    assert ids(q.execute(StepPlan(6, StepMode.EMPTY, 4, 1, ()))) == [5] and not q.has_inflight
    q.execute(plan(7, rows=(0,), pending=False))
    assert ids(q.execute(plan(8, rows=(2,), mode=StepMode.PREFILL, pending=False))) == [7, 8]
    assert not q.has_inflight


def test_disabled_queue_is_synchronous():
    q = AsyncDecodeQueue(FakeRunner(), is_enabled=False)
    for step in range(1, 5):
        assert ids(q.execute(plan(step, pending=False))) == [step]
    assert q.num_overlapped_steps == 0
