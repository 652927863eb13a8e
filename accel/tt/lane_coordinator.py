"""Drives every lane of the mesh with one shared step mode (vllm-tt-plugin's lane rules).

- Lanes = ``data_parallel_size``; each has its own ``LaneScheduler`` (per-lane ``max_num_seqs``,
  own block pool and block-id space).
- A new request goes to the lane with the smallest ``4 * waiting + running`` (ties: lowest
  index) and stays there for life, preemptions included.
- Mode per step: PREFILL when any lane has prefill intent, DECODE otherwise; when both kinds of
  work exist, prefill and decode steps alternate so running requests keep moving while long
  prompts are chunked in. Lanes without work for the mode contribute nothing.
- A PREFILL pass that schedules zero tokens (KV pressure) while some lane can decode is redone
  as DECODE, keeping the preemptions of the discarded pass.
- Slots: ``row = lane * per_lane + local``; lowest free local slot first; taken on admission,
  released on finish and (immediately) on preemption.

Pure logic: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from accel.tt.request_state import RequestState
from accel.tt.scheduler import LanePart, LaneScheduler
from accel.tt.step_plan import StepMode, StepPlan


class LaneCoordinator:
    def __init__(self, lanes: Sequence[LaneScheduler]):
        assert lanes and len({lane.per_lane for lane in lanes}) == 1
        self.lanes = list(lanes)
        self.per_lane = lanes[0].per_lane
        self._step_id = 0
        self._last_mode = StepMode.EMPTY
        self._finished_since_plan: set[str] = set()

    @property
    def num_waiting(self) -> int:
        return sum(len(lane.waiting) for lane in self.lanes)

    @property
    def num_running(self) -> int:
        return sum(len(lane.running) for lane in self.lanes)

    def pick_lane(self) -> int:
        return min(range(len(self.lanes)), key=lambda i: (self.lanes[i].load_score, i))

    def add_request(self, r: RequestState) -> None:
        """Bind ``r`` to the least-loaded lane (``r.lane`` is set here, once)."""
        r.lane = self.pick_lane()
        self.lanes[r.lane].add(r)

    def finish_request(self, r: RequestState) -> None:
        """Release everything ``r`` holds (finish or abort)."""
        self.lanes[r.lane].finish(r)
        self._finished_since_plan.add(r.req_id)

    def has_work(self) -> bool:
        return any(lane.waiting or lane.running for lane in self.lanes)

    def schedule(self) -> StepPlan:
        mode = self._choose_mode()
        parts: list[LanePart]
        is_retry = False
        preempted: list[str] = []
        if mode is StepMode.PREFILL:
            parts = [lane.schedule_prefill() for lane in self.lanes]
            if sum(p.num_tokens for p in parts) == 0:
                preempted = [rid for p in parts for rid in p.preempted_req_ids]
                if any(lane.has_decode_work() for lane in self.lanes):
                    mode, is_retry = StepMode.DECODE, True
                    parts = [lane.schedule_decode() for lane in self.lanes]
                else:
                    mode, parts = StepMode.EMPTY, []
        elif mode is StepMode.DECODE:
            parts = [lane.schedule_decode() for lane in self.lanes]
        else:
            parts = []
        rows = tuple(row for p in parts for row in p.rows)  # lane order, rows sorted per lane
        preempted += [rid for p in parts for rid in p.preempted_req_ids]
        if not rows:
            mode = StepMode.EMPTY
        self._step_id += 1
        self._last_mode = mode
        finished, self._finished_since_plan = frozenset(self._finished_since_plan), set()
        return StepPlan(
            step_id=self._step_id,
            mode=mode,
            per_lane=self.per_lane,
            num_lanes=len(self.lanes),
            rows=rows,
            finished_req_ids=finished,
            preempted_req_ids=frozenset(preempted),
            is_decode_retry=is_retry,
        )

    def _choose_mode(self) -> StepMode:
        wants_prefill = any(lane.has_prefill_intent() for lane in self.lanes)
        can_decode = any(lane.has_decode_work() for lane in self.lanes)
        if wants_prefill and not (can_decode and self._last_mode is StepMode.PREFILL):
            return StepMode.PREFILL
        if can_decode:
            return StepMode.DECODE
        return StepMode.EMPTY
