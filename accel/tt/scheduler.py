"""One lane's phase scheduler: every step it schedules prefill work or decode work, never both.

Algorithm (per lane; the lane coordinator picks the mode for all lanes):
- PREFILL: first continue running requests whose prompt is only partly computed (chunked
  prefill), then admit waiting requests FIFO while a slot is free, each row taking at most the
  remaining token budget (``max_num_batched_tokens``). Admission looks up the prefix cache
  (never the last token: one token must be computed to sample from). A waiting request that does
  not fit in the free blocks stops admission (FIFO: nobody overtakes it); a partial prefill that
  does not fit preempts the most recently admitted running request.
- DECODE: every running request with exactly one uncomputed token gets one row. When a new
  block is needed and none is free, the most recently admitted running request is preempted
  (possibly the request itself), so the oldest requests always progress: no deadlock (a lane's
  allocator holds at least one max_model_len sequence) and no starvation (preempted requests resume
  first, admission is FIFO).
- Preemption is by recompute: blocks and slot are released at once; the request returns to the
  front of the waiting queue and later prefills prompt + outputs again (the prefix cache usually
  keeps most of it).

Pure logic: no torch. The engine thread is the only caller.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from accel.tt.block_allocator import BlockAllocator
from accel.tt.request_state import RequestState, RequestStatus
from accel.tt.step_plan import PENDING_TOKEN, RowPlan


@dataclass
class LanePart:
    """What one lane contributes to a step."""

    rows: list[RowPlan] = field(default_factory=list)
    preempted_req_ids: list[str] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(r.num_scheduled_tokens for r in self.rows)


class LaneScheduler:
    def __init__(
        self,
        lane: int,
        per_lane: int,
        allocator: BlockAllocator,
        max_num_batched_tokens: int,
        max_model_len: int,
        enable_chunked_prefill: bool = True,
        mixes_image_rows: bool = True,
    ):
        self.lane = lane
        # False: the model class cannot take text-only and image rows in one prefill (the vision
        # classes upstream); the coordinator then asks for one kind per prefill step.
        self.mixes_image_rows = mixes_image_rows
        # Off: a prompt is admitted only when its whole uncomputed part fits this step's budget
        # (the engine then makes the budget at least max_model_len), for model classes whose
        # prefill cannot resume mid-prompt.
        self.enable_chunked_prefill = enable_chunked_prefill
        self.per_lane = per_lane
        self.allocator = allocator
        self.block_size = allocator.block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []  # admission order (oldest first)
        self._free_slots = list(range(per_lane))  # heap: lowest local slot first

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    def has_prefill_intent(self) -> bool:
        for r in self.running:  # (a loop, not any(genexpr): per step over every running request)
            if len(r.token_ids) + r.num_pending - r.num_computed > 1:
                return True
        return bool(self._free_slots) and any(not r.is_kv_preloaded for r in self.waiting)

    def has_decode_work(self) -> bool:
        if self._free_slots and self.waiting and self.waiting[0].is_kv_preloaded:
            return True  # admitted straight into the next decode step
        return any(self._is_decodable(r) for r in self.running)

    def _is_decodable(self, r: RequestState) -> bool:
        return r.is_decode_ready and not (r.num_pending and r.will_finish_by_length(self.max_model_len))

    # ---- membership ----------------------------------------------------------------------
    def add(self, r: RequestState) -> None:
        r.status = RequestStatus.WAITING
        self.waiting.append(r)

    def finish(self, r: RequestState) -> None:
        """Return every block and the slot (finish or abort); idempotent."""
        if r.status is RequestStatus.RUNNING:
            self.running.remove(r)
        elif r.status is RequestStatus.WAITING:
            self.waiting.remove(r)
        self._release(r)
        r.status = RequestStatus.FINISHED

    def _release(self, r: RequestState) -> None:
        if r.preloaded_block is not None:  # finished or aborted before admission adopted it
            self.allocator.free([r.preloaded_block])
            r.preloaded_block = None
        r.is_kv_preloaded = False
        if r.block_ids:
            self.allocator.free(r.block_ids)
            r.block_ids = []
            r.block_table = ()
        r.num_cached_blocks = 0
        if r.slot is not None:
            heapq.heappush(self._free_slots, r.slot - self.lane * self.per_lane)
            r.slot = None

    def preempt(self, r: RequestState) -> None:
        self.running.remove(r)
        self._release(r)
        r.num_computed = 0
        r.num_preemptions += 1
        r.status = RequestStatus.WAITING
        self.waiting.appendleft(r)

    def _admit(self, r: RequestState) -> None:
        self.waiting.popleft()
        r.slot = self.lane * self.per_lane + heapq.heappop(self._free_slots)
        r.status = RequestStatus.RUNNING
        self.running.append(r)

    # ---- prefill -------------------------------------------------------------------------
    def schedule_prefill(self, images_only: bool | None = None) -> LanePart:
        """``images_only``: True = only requests with images, False = only text-only requests,
        None = both. A waiting head of the other kind stops admission (FIFO)."""
        part = LanePart()
        budget = self.max_num_batched_tokens
        for r in list(self.running):
            if budget == 0:
                break
            if r.status is not RequestStatus.RUNNING or not r.is_prefilling:
                continue
            if images_only is not None and bool(r.images) is not images_only:
                continue
            chunk = min(r.num_uncomputed, budget)
            if not self._reserve(r, r.num_computed + chunk, part):
                continue  # r itself was preempted
            part.rows.append(self._prefill_row(r, chunk))
            budget -= chunk
        while budget > 0 and self.waiting and self._free_slots:
            r = self.waiting[0]
            if r.num_pending:  # its last token is still in flight; admit it next step
                break
            if images_only is not None and bool(r.images) is not images_only:
                break
            if r.is_kv_preloaded and self._try_admit_preloaded(r):
                continue  # no prefill row: it decodes from the next decode step on
            chunk = self._try_admit(r, budget)
            if chunk == 0:
                break
            part.rows.append(self._prefill_row(r, chunk))
            budget -= chunk
        return part

    def _try_admit(self, r: RequestState, budget: int) -> int:
        """Admit ``r`` with a prefix-cache lookup and blocks for its first chunk; 0 = no room."""
        r.update_block_hashes(self.block_size)
        # Never take the last token from the cache: its logits are needed.
        max_hit_blocks = (r.num_tokens - 1) // self.block_size
        hit = self.allocator.find_cached_prefix(r.block_hashes[:max_hit_blocks])
        num_hit_tokens = len(hit) * self.block_size
        chunk = min(r.num_tokens - num_hit_tokens, budget)
        if not self.enable_chunked_prefill and chunk < r.num_tokens - num_hit_tokens:
            return 0  # whole prompts only: wait for a step with budget for all of it
        num_new = -(-(num_hit_tokens + chunk) // self.block_size) - len(hit)
        if num_new > self.allocator.num_free_after_touch(hit):
            return 0
        self.allocator.touch(hit)  # before allocating: the hit must not be evicted for the new blocks
        self._adopt(r, hit, self.allocator.allocate(num_new), num_hit_tokens)
        return chunk

    def _adopt(self, r: RequestState, hit: list[int], more_blocks: list[int], num_computed: int) -> None:
        """Admit ``r`` holding the prefix-cache ``hit`` (already touched) plus ``more_blocks``, its
        first ``num_computed`` tokens' KV present (counted as prefix hits)."""
        r.block_ids = hit + more_blocks
        r.block_table = tuple(r.block_ids)
        r.num_cached_blocks = len(hit)
        r.num_computed = r.num_prefix_hit_tokens = num_computed
        self.allocator.record_prefix_query(r.num_tokens, num_computed)
        self._admit(r)

    def _try_admit_preloaded(self, r: RequestState) -> bool:
        """Admit ``r`` (head of ``waiting``, ``is_kv_preloaded``) with its imported KV: the full
        blocks from the prefix cache plus the preloaded tail block, every prompt token but the
        last computed. False when the cache no longer holds every full block (evicted since the
        import): the preload is dropped and ``r`` is admitted the ordinary way (a prefill)."""
        bs = self.block_size
        r.update_block_hashes(bs)
        num_full = (r.num_tokens - 1) // bs
        hit = self.allocator.find_cached_prefix(r.block_hashes[:num_full])
        if len(hit) < num_full:
            self._release(r)  # frees the tail block; r stays waiting, nothing else held
            return False
        self.allocator.touch(hit)
        tail = [r.preloaded_block] if r.preloaded_block is not None else []
        r.preloaded_block, r.is_kv_preloaded = None, False
        self._adopt(r, hit, tail, r.num_tokens - 1)
        return True

    def _prefill_row(self, r: RequestState, chunk: int) -> RowPlan:
        assert r.slot is not None  # running: it holds a slot
        start, end = r.num_computed, r.num_computed + chunk
        samples = end == r.num_tokens
        row = RowPlan(
            req_id=r.req_id,
            lane=self.lane,
            row=r.slot,
            start_pos=start,
            end_pos=end,
            input_token_ids=tuple(r.token_ids[:end]),
            block_ids=r.block_table,
            samples=samples,
            sampling=r.sampling,
            num_output_tokens=r.num_output_tokens,
            history_token_ids=_history(r),
            images=r.images or None,
        )
        r.num_computed = end
        if samples:
            r.num_pending += 1
        return row

    # ---- decode --------------------------------------------------------------------------
    def schedule_decode(self) -> LanePart:
        part = LanePart()
        # Imported prompts join here, without a prefill step (FIFO: only from the queue's head).
        while self._free_slots and self.waiting and self.waiting[0].is_kv_preloaded and not self.waiting[0].num_pending:
            if not self._try_admit_preloaded(self.waiting[0]):
                break
        lane, bs, max_len = self.lane, self.block_size, self.max_model_len
        rows = part.rows
        for r in list(self.running):  # hot path at 128 rows: properties inlined
            if r.status is not RequestStatus.RUNNING:
                continue
            pos, num_known, num_pending = r.num_computed, len(r.token_ids), r.num_pending
            if num_known + num_pending - pos != 1:
                continue  # mid-prefill, or waiting for a result
            if num_pending:  # is its in-flight token its last? (will_finish_by_length, inlined)
                max_tokens = r.sampling.max_tokens
                if num_known + num_pending >= max_len or (
                    max_tokens is not None and num_known + num_pending - r.num_prompt_tokens >= max_tokens
                ):
                    continue
            if pos // bs >= len(r.block_ids) and not self._reserve(r, pos + 1, part):
                continue
            token = r.token_ids[pos] if pos < num_known else PENDING_TOKEN
            history = _history(r) if r.has_penalties else None
            slot = r.slot
            assert slot is not None  # running: it holds a slot
            rows.append(
                RowPlan(
                    r.req_id,
                    lane,
                    slot,
                    pos,
                    pos + 1,
                    (token,),
                    r.block_table,
                    True,
                    r.sampling,
                    num_known + num_pending - r.num_prompt_tokens,
                    history,
                )
            )
            r.num_computed = pos + 1
            r.num_pending = num_pending + 1
        rows.sort(key=_row_index)
        return part

    def _reserve(self, r: RequestState, num_tokens: int, part: LanePart) -> bool:
        """Blocks for ``num_tokens`` positions of running ``r``, preempting the most recently
        admitted requests while short. False when ``r`` itself had to go."""
        need = -(-num_tokens // self.block_size) - len(r.block_ids)
        while need > self.allocator.num_free_blocks:
            victim = self.running[-1]
            self.preempt(victim)
            part.preempted_req_ids.append(victim.req_id)
            if victim is r:
                return False
        if need > 0:
            r.block_ids.extend(self.allocator.allocate(need))
            r.block_table = tuple(r.block_ids)
        return True

    # ---- after a step --------------------------------------------------------------------
    def cache_computed_blocks(self, requests: Iterable[RequestState]) -> None:
        """Register newly full, computed blocks of ``requests`` in the prefix cache."""
        if not self.allocator.enable_prefix_caching:
            return
        bs = self.block_size
        for r in requests:
            num_tokens = min(r.num_computed, len(r.token_ids))
            # (the common decode step fills no block: skip the call)
            if r.status is RequestStatus.RUNNING and num_tokens // bs > r.num_cached_blocks:
                self._cache_blocks_up_to(r, num_tokens)

    def cache_finishing_blocks(self, r: RequestState) -> None:
        """Before running ``r`` is freed at its finish: register the blocks its last step
        filled (a next turn of the conversation starts with them). Positions up to, not
        including, the last sampled token were fed by applied steps, so their KV is written."""
        if self.allocator.enable_prefix_caching and r.status is RequestStatus.RUNNING:
            self._cache_blocks_up_to(r, min(r.num_computed, len(r.token_ids) - 1))

    def _cache_blocks_up_to(self, r: RequestState, num_tokens: int) -> None:
        num_full = num_tokens // self.block_size
        if num_full <= r.num_cached_blocks:
            return
        r.update_block_hashes(self.block_size)
        lo = r.num_cached_blocks
        self.allocator.cache_blocks(r.block_ids[lo:num_full], r.block_hashes[lo:num_full])
        r.num_cached_blocks = num_full


def _row_index(row: RowPlan) -> int:
    return row.row


def _history(r: RequestState) -> tuple[int, ...] | None:
    """Prompt + outputs for host penalties (pending tokens as PENDING_TOKEN); None otherwise."""
    if not r.has_penalties:
        return None
    return tuple(r.token_ids) + (PENDING_TOKEN,) * r.num_pending
