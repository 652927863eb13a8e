"""The engine step: plan = schedule(); results = execute(plan); outputs = update(results).

``EngineCore`` owns the request states and is driven by exactly one thread (the engine's step
loop). It records a ``StepRecord`` per executed step so tests can prove the lane rules: every
step homogeneous (one mode), each request on its lane, one mesh dispatch per step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from accel.contract import EngineStats, GenerateRequest, KVTransferParams, PrefixCacheChange, TTEngineStats
from accel.text.stop_tokens import check_token_stop
from accel.tt.async_decode import AsyncDecodeQueue
from accel.tt.block_allocator import BlockAllocator
from accel.tt.core_messages import NewTokens
from accel.tt.lane_coordinator import LaneCoordinator
from accel.tt.request_state import RequestState, RequestStatus
from accel.tt.runner import NO_TOKEN, StepResult
from accel.tt.step_plan import StepMode, StepPlan


class KVHookPoints(Protocol):
    """Where prefill/decode KV transfer attaches (engine thread; ``lane_kv`` = that lane's
    ``[layer] = [K, V]`` from ``allocate_kv_cache``; block ids are lane-local)."""

    async def prefetch(self, request: GenerateRequest) -> None:
        """Asyncio side, before ``request`` reaches the engine thread: the network part of an
        import (a no-op for requests that import nothing, or for hooks that fetch in
        ``on_added``)."""

    def may_import(self, r: RequestState) -> bool:
        """Whether ``on_added`` may write KV for ``r`` (the engine then lets in-flight steps
        finish first; for other requests it does not wait)."""

    def on_added(self, r: RequestState, allocator: BlockAllocator, lane_kv: Any) -> None:
        """``r`` was bound to its lane and nothing is scheduled yet: an import can allocate blocks
        in ``allocator``, write the KV, ``cache_blocks`` them under ``r``'s prompt hashes and free them;
        admission then takes them as a prefix hit (tokens marked computed)."""

    def on_finished(self, r: RequestState, lane_kv: Any) -> KVTransferParams | None:
        """``r`` finished normally and still holds ``r.block_ids`` (freed right after): an export
        gathers its KV and returns the ticket for its final delta."""


@dataclass(frozen=True)
class StepRecord:
    step_id: int
    mode: StepMode
    # per lane: ((req_id, row, num_scheduled_tokens), ...)
    lane_rows: tuple[tuple[tuple[str, int, int], ...], ...]
    num_dispatches: int  # mesh-model calls made for this plan
    is_device_sampled: bool | None  # None until the step's result is applied
    is_decode_retry: bool
    preempted_req_ids: frozenset[str]


class EngineCore:
    def __init__(
        self,
        coordinator: LaneCoordinator,
        queue: AsyncDecodeQueue,
        eos_token_ids: frozenset[int],
        max_model_len: int,
        keep_step_log: bool = False,
        kv_hooks: KVHookPoints | None = None,
        kv_cache: Any = None,
    ):
        self.coordinator = coordinator
        self.kv_hooks = kv_hooks
        self.kv_cache = kv_cache  # [lane][layer] = [K, V], for kv_hooks only
        self.queue = queue
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.requests: dict[str, RequestState] = {}
        self.keep_step_log = keep_step_log
        self.step_log: list[StepRecord] = []
        # Cumulative counts of executed (non-empty) steps and of sampled tokens by where sampling ran.
        self.num_steps = 0
        self.num_prefill_steps = 0
        self.num_decode_steps = 0
        self.num_device_sampled_tokens = 0
        self.num_host_sampled_tokens = 0

    # ---- requests ----------------------------------------------------------------------
    def add_request(self, r: RequestState) -> None:
        if r.req_id in self.requests:
            raise ValueError(f"request id {r.req_id!r} is already in the engine")
        self.requests[r.req_id] = r
        if r.constraint is not None:
            self.queue.runner.constraints[r.req_id] = r.constraint
        self.coordinator.add_request(r)
        if self.kv_hooks is not None and self.kv_hooks.may_import(r):
            # An import writes KV from the host into blocks it allocates now. The in-flight step
            # writes each row's KV at its position; when that block is free (the row's request
            # finished or was aborted after the step went out), the import could get it, so let
            # the step finish first (its result stays queued for the next step). Otherwise the
            # step writes only blocks held by live requests and the import runs beside it.
            if self._inflight_writes_free_block():
                self.queue.wait_idle()
            try:
                self.kv_hooks.on_added(r, self.coordinator.lanes[r.lane].allocator, self.kv_cache[r.lane])
            except Exception:
                self._finish(r)  # nothing of it was scheduled; it leaves no trace
                raise

    def _inflight_writes_free_block(self) -> bool:
        """Whether the step still on the mesh writes KV into a block no live request holds. (Only
        a decode is ever left in flight: each row writes the one token at ``start_pos``.)"""
        plan = self.queue.inflight_plan
        if plan is None:
            return False
        lanes = self.coordinator.lanes
        for row in plan.rows:
            allocator = lanes[row.lane].allocator
            if allocator.ref_count(row.block_ids[row.start_pos // allocator.block_size]) == 0:
                return True
        return False

    def abort_request(self, req_id: str) -> NewTokens | None:
        """Free everything ``req_id`` holds; the abort notice, or None if unknown or done."""
        r = self.requests.get(req_id)
        if r is None:
            return None
        self._finish(r)
        return NewTokens(req_id, (), None, r.num_prefix_hit_tokens, is_aborted=True)

    def finish_request(self, req_id: str) -> None:
        """The consumer saw a stop (e.g. a stop string): free the request, no notice."""
        r = self.requests.get(req_id)
        if r is not None:
            self.coordinator.lanes[r.lane].cache_finishing_blocks(r)
            self._finish(r)

    def has_work(self) -> bool:
        return self.coordinator.has_work() or self.queue.has_inflight

    # ---- the step ----------------------------------------------------------------------
    def step(self) -> list[NewTokens]:
        plan = self.coordinator.schedule()
        num_before = self.queue.runner.num_dispatches
        completed = self.queue.execute(plan)
        self._record(plan, self.queue.runner.num_dispatches - num_before)
        return [delta for done_plan, result in completed for delta in self.update(done_plan, result)]

    def drain(self) -> list[NewTokens]:
        return [d for p, res in self.queue.drain() for d in self.update(p, res)]

    def update(self, plan: StepPlan, result: StepResult) -> list[NewTokens]:
        """Apply a finished step: append tokens, apply token stops, cache newly full blocks."""
        outputs: list[NewTokens] = []
        touched: list[list[RequestState]] = [[] for _ in self.coordinator.lanes]  # per lane
        logprobs = result.logprobs
        requests = self.requests
        for i, (row, token) in enumerate(zip(plan.rows, result.token_ids)):
            r = requests.get(row.req_id)
            if r is None:
                continue  # finished or aborted while this step was in flight
            touched[r.lane].append(r)
            if token == NO_TOKEN:
                continue
            r.num_pending -= 1
            r.token_ids.append(token)
            if r.constraint is not None:
                r.constraint.accept(token)  # (constrained rows sample on the host: never pending)
            row_logprob = None if logprobs is None else logprobs[i]
            lp = None if row_logprob is None else (row_logprob,)
            num_prompt = r.num_prompt_tokens
            if (
                check_token_stop(
                    token, len(r.token_ids) - num_prompt, num_prompt, r.sampling, self.eos_token_ids, self.max_model_len
                )
                is None
            ):
                outputs.append(NewTokens(r.req_id, (token,), lp, r.num_prefix_hit_tokens))
                continue
            ticket = None
            if self.kv_hooks is not None:
                ticket = self.kv_hooks.on_finished(r, self.kv_cache[r.lane])
            outputs.append(NewTokens(r.req_id, (token,), lp, r.num_prefix_hit_tokens, kv_transfer=ticket))
            self.coordinator.lanes[r.lane].cache_finishing_blocks(r)
            self._finish(r)
        for lane, lane_requests in zip(self.coordinator.lanes, touched):
            lane.cache_computed_blocks(lane_requests)
        num_sampled = sum(1 for t in result.token_ids if t != NO_TOKEN)
        if result.is_device_sampled:
            self.num_device_sampled_tokens += num_sampled
        else:
            self.num_host_sampled_tokens += num_sampled
        if self.keep_step_log:
            self._mark_sampling(plan, result)
        return outputs

    def _finish(self, r: RequestState) -> None:
        if r.constraint is not None:
            self.queue.runner.constraints.pop(r.req_id, None)
        self.queue.runner.rope_deltas.drop(r.req_id)
        self.coordinator.finish_request(r)
        del self.requests[r.req_id]
        r.status = RequestStatus.FINISHED

    # ---- observability -----------------------------------------------------------------
    def stats(self, platform: str) -> EngineStats:
        """Load and cache snapshot over every lane."""
        coordinator = self.coordinator
        allocators = [lane.allocator for lane in coordinator.lanes]
        return EngineStats(
            num_waiting=coordinator.num_waiting,
            num_running=coordinator.num_running,
            num_kv_blocks_total=sum(allocator.num_blocks for allocator in allocators),
            num_kv_blocks_free=sum(allocator.num_free_blocks for allocator in allocators),
            prefix_cache_queries=sum(allocator.prefix_cache_queries for allocator in allocators),
            prefix_cache_hits=sum(allocator.prefix_cache_hits for allocator in allocators),
            platform=platform,
        )

    def step_stats(self) -> TTEngineStats:
        """How the steps ran so far (``TTMeshEngine.extra_stats``)."""
        num_decode = self.num_decode_steps
        return TTEngineStats(
            num_prefill_steps=self.num_prefill_steps,
            num_decode_steps=num_decode,
            num_device_sampled_tokens=self.num_device_sampled_tokens,
            num_host_sampled_tokens=self.num_host_sampled_tokens,
            lane_occupancy=tuple(len(lane.running) / lane.per_lane for lane in self.coordinator.lanes),
            async_overlap_fraction=self.queue.num_overlapped_steps / num_decode if num_decode else 0.0,
        )

    def take_kv_events(self) -> list[PrefixCacheChange]:
        """Every lane's cache changes, in lane order, each tagged with its lane: lanes are separate
        prefix caches (a request only hits its own lane's), so the router's index keeps them
        apart and matches a prompt against the replica's best lane."""
        return [event for lane in self.coordinator.lanes for event in lane.allocator.take_kv_events()]

    def _record(self, plan: StepPlan, num_dispatches: int) -> None:
        if plan.mode is StepMode.EMPTY:
            return
        self.num_steps += 1
        if plan.mode is StepMode.PREFILL:
            self.num_prefill_steps += 1
        else:
            self.num_decode_steps += 1
        if not self.keep_step_log:
            return
        lane_rows = tuple(
            tuple((r.req_id, r.row, r.num_scheduled_tokens) for r in plan.rows_of_lane(i))
            for i in range(plan.num_lanes)
        )
        self.step_log.append(
            StepRecord(
                plan.step_id, plan.mode, lane_rows, num_dispatches, None, plan.is_decode_retry, plan.preempted_req_ids
            )
        )

    def _mark_sampling(self, plan: StepPlan, result: StepResult) -> None:
        for i in range(len(self.step_log) - 1, -1, -1):
            rec = self.step_log[i]
            if rec.step_id == plan.step_id:
                self.step_log[i] = dataclasses.replace(rec, is_device_sampled=result.is_device_sampled)
                return


def lanes_of(records: Iterable[StepRecord]) -> dict[str, set[int]]:
    """Request id -> every lane it was scheduled on (a test helper for static binding)."""
    seen: dict[str, set[int]] = {}
    for rec in records:
        for lane, rows in enumerate(rec.lane_rows):
            for req_id, _, _ in rows:
                seen.setdefault(req_id, set()).add(lane)
    return seen
