"""Drives every lane of the mesh with one shared step mode (vllm-tt-plugin's lane rules).

- Lanes = ``data_parallel_size``; each has its own ``LaneScheduler`` (per-lane ``max_num_seqs``,
  own block allocator and block-id space).
- Lanes are KV cache domains (each its own prefix cache). A new request goes to the lane of its
  session when that lane is not overloaded, else to the lane the prefix-vs-load rule picks
  (``accel.cache_affinity``, the router's rule, over each lane's cached prefix of the prompt and
  its load: ``running + waiting + w_queue * waiting + w_kv_usage * kv_usage``); ties: lowest
  index. It stays there for life, preemptions included, and binds its session to that lane.
  The router applies the same rule to replicas, knowing each lane's blocks from the lane-tagged
  KV events, so the replica it picks for its best lane match is where that lane wins again (the
  upstream plugin's ``4 * waiting + running`` pick ignores the cache: a session's next turn
  could land on another lane and miss its own history).
- Mode per step: PREFILL when any lane has prefill intent, DECODE otherwise; when both kinds of
  work exist, prefill and decode steps alternate so running requests keep moving while long
  prompts are chunked in. Lanes without work for the mode contribute nothing.
- A PREFILL pass that schedules zero tokens (KV pressure) while some lane can decode is redone
  as DECODE, keeping the preemptions of the discarded pass.
- A model class that cannot mix text-only and image rows in one prefill (the vision classes
  upstream) gets prefill steps of one kind; while both kinds wait they take turns.
- Slots: ``row = lane * per_lane + local``; lowest free local slot first; taken on admission,
  released on finish and (immediately) on preemption.

Pure logic: no torch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from accel.cache_affinity import AffinityWeights, cheapest, load_limit, load_score
from accel.tt.request_state import RequestState
from accel.tt.scheduler import LanePart, LaneScheduler
from accel.tt.step_plan import StepMode, StepPlan

MAX_SESSIONS = 65536  # session -> lane bindings kept (least recently used dropped first)


class LaneCoordinator:
    def __init__(self, lanes: Sequence[LaneScheduler], weights: AffinityWeights | None = None):
        assert lanes and len({lane.per_lane for lane in lanes}) == 1
        self.lanes = list(lanes)
        self.per_lane = lanes[0].per_lane
        self.weights = weights or AffinityWeights()
        self._step_id = 0
        self._last_mode = StepMode.EMPTY
        self._next_prefill_images = False  # the kind a non-mixing class's next prefill tries first
        self._finished_since_plan: set[str] = set()
        self._session_lane: OrderedDict[str, int] = OrderedDict()  # LRU, oldest first

    @property
    def num_waiting(self) -> int:
        return sum(len(lane.waiting) for lane in self.lanes)

    @property
    def num_running(self) -> int:
        return sum(len(lane.running) for lane in self.lanes)

    def lane_load(self, i: int) -> float:
        """Lane ``i``'s load score (``accel.cache_affinity.load_score``, the router's units)."""
        lane = self.lanes[i]
        allocator = lane.allocator
        num_waiting = len(lane.waiting)
        kv_usage = 1.0 - allocator.num_free_blocks / allocator.num_blocks
        return load_score(len(lane.running) + num_waiting, num_waiting, kv_usage, self.weights)

    def cached_prefix_blocks(self, r: RequestState) -> list[int]:
        """Per lane, the leading blocks of ``r``'s tokens its prefix cache holds (never the
        block of the last token: admission computes that one anyway)."""
        bs = self.lanes[0].block_size
        r.update_block_hashes(bs)
        hashes = r.block_hashes[: (r.num_tokens - 1) // bs]
        return [len(lane.allocator.find_cached_prefix(hashes)) for lane in self.lanes]

    def pick_lane(self, r: RequestState) -> int:
        """The lane for new request ``r``: its session's lane unless overloaded, else the
        cheapest by prefix-vs-load cost (ties: lowest index)."""
        n = len(self.lanes)
        scores = [self.lane_load(i) for i in range(n)]
        limit = load_limit(min(scores), self.weights)
        session = r.request.session_id
        bound = self._session_lane.get(session) if session else None
        if bound is not None and bound < n and scores[bound] <= limit:
            return bound
        if n == 1:
            return 0
        matched = self.cached_prefix_blocks(r)
        return cheapest(range(n), scores.__getitem__, matched.__getitem__, limit, self.weights)[0]

    def session_lane(self, session_id: str) -> int | None:
        return self._session_lane.get(session_id)

    def add_request(self, r: RequestState) -> None:
        """Bind ``r`` to its lane (``r.lane`` is set here, once) and its session to that lane."""
        r.lane = self.pick_lane(r)
        session = r.request.session_id
        if session:
            self._session_lane[session] = r.lane
            self._session_lane.move_to_end(session)
            if len(self._session_lane) > MAX_SESSIONS:
                self._session_lane.popitem(last=False)
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
            parts = self._schedule_prefill()
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

    def _schedule_prefill(self) -> list[LanePart]:
        if self.lanes[0].mixes_image_rows:
            return [lane.schedule_prefill() for lane in self.lanes]
        # The class cannot take text-only and image rows in one prefill: one kind per step, the
        # kinds taking turns while both wait (neither starves the other).
        for images_only in (self._next_prefill_images, not self._next_prefill_images):
            parts = [lane.schedule_prefill(images_only) for lane in self.lanes]
            if sum(p.num_tokens for p in parts):
                self._next_prefill_images = not images_only
                break
        return parts

    def _choose_mode(self) -> StepMode:
        wants_prefill = any(lane.has_prefill_intent() for lane in self.lanes)
        can_decode = any(lane.has_decode_work() for lane in self.lanes)
        if wants_prefill and not (can_decode and self._last_mode is StepMode.PREFILL):
            return StepMode.PREFILL
        if can_decode:
            return StepMode.DECODE
        return StepMode.EMPTY
