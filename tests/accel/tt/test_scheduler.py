"""LaneScheduler with fabricated step results (no model, no torch)."""

from __future__ import annotations

from accel.contract import GenerateRequest, SamplingParams
from accel.tt.block_allocator import BlockAllocator
from accel.tt.request_state import RequestState, RequestStatus
from accel.tt.scheduler import LaneScheduler
from accel.tt.step_plan import PENDING_TOKEN


def make_lane(num_blocks=16, block_size=4, per_lane=4, budget=8, max_model_len=64, caching=True, lane=0):
    return LaneScheduler(
        lane, per_lane, BlockAllocator(num_blocks, block_size, caching, lane=lane), budget, max_model_len
    )


def make_req(rid, prompt_len, max_tokens=8, first=10, cache_salt=None):
    req = GenerateRequest(
        rid,
        tuple(range(first, first + prompt_len)),
        SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
        cache_salt=cache_salt,
    )
    return RequestState.new(req, lane=0)


def apply(lane, rows, requests, token=5):
    """What the engine does with a step result: append sampled tokens, cache full blocks."""
    for row in rows:
        r = requests[row.req_id]
        if row.samples:
            r.num_pending -= 1
            r.token_ids.append(token)
    lane.cache_computed_blocks(requests[row.req_id] for row in rows)


def test_chunked_prefill_respects_budget_and_samples_only_at_the_end():
    lane = make_lane(budget=8)
    r = make_req("a", 20)
    lane.add(r)
    reqs = {"a": r}
    chunks = []
    while r.is_prefilling or r.status is RequestStatus.WAITING:
        part = lane.schedule_prefill()
        (row,) = part.rows
        chunks.append((row.start_pos, row.end_pos, row.samples))
        assert row.input_token_ids == tuple(r.token_ids[: row.end_pos])
        assert len(row.block_ids) * 4 >= row.end_pos
        apply(lane, part.rows, reqs)
    assert chunks == [(0, 8, False), (8, 16, False), (16, 20, True)]
    assert r.is_decode_ready and r.num_computed == 20 and len(r.token_ids) == 21


def test_decode_rows_carry_last_token_and_grow_blocks():
    lane = make_lane(block_size=4)
    r = make_req("a", 4)
    lane.add(r)
    reqs = {"a": r}
    apply(lane, lane.schedule_prefill().rows, reqs, token=42)
    part = lane.schedule_decode()
    (row,) = part.rows
    assert (row.start_pos, row.end_pos, row.input_token_ids) == (4, 5, (42,))
    assert len(row.block_ids) == 2  # position 4 needs a second block of 4
    # Async: scheduling again before the result is applied feeds the pending token.
    part2 = lane.schedule_decode()
    assert part2.rows[0].input_token_ids == (PENDING_TOKEN,) and r.num_pending == 2


def test_prefix_hit_skips_cached_blocks_but_never_the_last_token():
    lane = make_lane(block_size=4, budget=64)
    a, b = make_req("a", 12), make_req("b", 12)
    lane.add(a)
    reqs = {"a": a, "b": b}
    apply(lane, lane.schedule_prefill().rows, reqs)
    lane.add(b)
    (row,) = lane.schedule_prefill().rows
    # 12 tokens = 3 full blocks cached, but the last token must be computed: hit 2 blocks.
    assert (row.start_pos, row.end_pos) == (8, 12)
    assert row.block_ids[:2] == tuple(a.block_ids[:2])
    assert lane.allocator.prefix_cache_hits == 8 and lane.allocator.prefix_cache_queries == 24


def test_salted_prompts_share_a_prefix_only_with_the_same_salt():
    lane = make_lane(block_size=4, budget=64, num_blocks=32)
    a = make_req("a", 12, cache_salt="s1")
    reqs = {"a": a}
    lane.add(a)
    apply(lane, lane.schedule_prefill().rows, reqs)
    for rid, salt, start in [("plain", None, 0), ("other", "s2", 0), ("same", "s1", 8)]:
        r = reqs[rid] = make_req(rid, 12, cache_salt=salt)
        lane.add(r)
        (row,) = lane.schedule_prefill().rows
        assert row.start_pos == start, rid  # only the same salt hits a's cached blocks
        apply(lane, [row], reqs)


def test_decode_preempts_latest_admitted_and_it_resumes_first():
    # 6 blocks of 4: two requests of 8 tokens hold 4 blocks; growing both needs 2 more each.
    lane = make_lane(num_blocks=6, block_size=4, per_lane=2, budget=64, caching=False)
    a, b = make_req("a", 8, max_tokens=20), make_req("b", 8, max_tokens=20)
    reqs = {"a": a, "b": b}
    lane.add(a)
    lane.add(b)
    apply(lane, lane.schedule_prefill().rows, reqs)
    preempted = []
    for _ in range(6):
        part = lane.schedule_decode()
        preempted += part.preempted_req_ids
        apply(lane, part.rows, reqs)
        if preempted:
            break
    assert preempted == ["b"]
    assert b.status is RequestStatus.WAITING and b.block_ids == [] and b.slot is None
    assert b.num_computed == 0 and b.num_preemptions == 1 and lane.waiting[0] is b
    assert a.status is RequestStatus.RUNNING
    # b's outputs survive: its resumed prefill covers prompt + outputs.
    assert len(b.token_ids) > 8


def test_request_preempts_itself_when_alone_and_stuck():
    lane = make_lane(num_blocks=4, block_size=4, per_lane=2, budget=64, caching=False, max_model_len=16)
    a, b = make_req("a", 6), make_req("b", 8)
    reqs = {"a": a, "b": b}
    lane.add(a)
    lane.add(b)
    apply(lane, lane.schedule_prefill().rows, reqs)  # a: 2 blocks, b: 2 blocks + samples
    # b's position 8 needs a third block: none free, b is the latest -> b preempts itself.
    part = lane.schedule_decode()
    assert part.preempted_req_ids == ["b"]
    assert [r.req_id for r in part.rows] == ["a"]


def test_finish_returns_every_block_and_the_slot():
    lane = make_lane(num_blocks=8, per_lane=2, budget=64)
    a, b = make_req("a", 9), make_req("b", 3)
    reqs = {"a": a, "b": b}
    lane.add(a)
    lane.add(b)
    apply(lane, lane.schedule_prefill().rows, reqs)
    assert (a.slot, b.slot) == (0, 1)
    lane.finish(a)
    lane.finish(b)
    lane.finish(b)  # idempotent
    assert lane.allocator.num_free_blocks == 8 and lane.num_free_slots == 2
    c = make_req("c", 2)
    lane.add(c)
    lane.schedule_prefill()
    assert c.slot == 0  # lowest free slot first


def test_admission_is_fifo_and_stops_at_a_request_that_does_not_fit():
    lane = make_lane(num_blocks=4, block_size=4, per_lane=4, budget=64, caching=False, max_model_len=16)
    big, small = make_req("big", 15), make_req("small", 2)
    hog = make_req("hog", 6)
    reqs = {"big": big, "small": small, "hog": hog}
    lane.add(hog)
    apply(lane, lane.schedule_prefill().rows, reqs)  # hog holds 2 of 4 blocks
    lane.add(big)
    lane.add(small)
    part = lane.schedule_prefill()
    assert part.rows == []  # big needs 4 blocks; small may not overtake it
    assert lane.has_prefill_intent()


def test_will_finish_rows_are_not_scheduled_while_their_last_token_is_pending():
    lane = make_lane()
    r = make_req("a", 3, max_tokens=1)
    lane.add(r)
    lane.schedule_prefill()  # samples the one and only token (pending)
    assert not lane.has_decode_work()
    assert lane.schedule_decode().rows == []


def _preload(lane, r):
    """What ``KVTransferHooks.on_added`` leaves for an imported prompt: its full blocks (all but the
    last token's) cached and released, its partial tail in a block the request holds."""
    from accel.block_hash import hash_prompt_blocks

    bs = lane.block_size
    num_full = (r.num_tokens - 1) // bs
    blocks = lane.allocator.allocate(num_full)
    lane.allocator.cache_blocks(blocks, hash_prompt_blocks(r.token_ids[: num_full * bs], bs))
    lane.allocator.free(blocks)
    if (r.num_tokens - 1) % bs:
        r.preloaded_block = lane.allocator.allocate(1)[0]
    r.is_kv_preloaded = True
    return blocks


def test_an_imported_prompt_starts_in_a_decode_step():
    lane = make_lane(block_size=4)
    r = make_req("a", 11)  # 10 imported tokens: 2 full blocks + a 2-token tail block
    full = _preload(lane, r)
    tail = r.preloaded_block
    lane.add(r)
    assert not lane.has_prefill_intent() and lane.has_decode_work()
    part = lane.schedule_decode()
    (row,) = part.rows
    assert (row.start_pos, row.end_pos, row.input_token_ids) == (10, 11, (r.token_ids[10],))
    assert row.samples and row.num_output_tokens == 0
    assert r.block_ids == full + [tail] and r.num_computed == 11 and r.num_prefix_hit_tokens == 10
    assert r.preloaded_block is None and not r.is_kv_preloaded
    # A prefill pass admits it too, without a row of its own (the coordinator then decodes).
    lane2 = make_lane(block_size=4)
    r2 = make_req("b", 9)  # 8 imported tokens: 2 full blocks, empty tail
    _preload(lane2, r2)
    lane2.add(r2)
    assert lane2.schedule_prefill().rows == [] and r2.status is RequestStatus.RUNNING
    (row2,) = lane2.schedule_decode().rows
    assert (row2.start_pos, len(row2.block_ids)) == (8, 3)  # position 8 opens a third block


def test_an_imported_prompt_aborted_while_waiting_frees_its_tail_block():
    lane = make_lane(block_size=4, per_lane=1)
    lane.add(make_req("busy", 3))
    lane.schedule_prefill()  # takes the only slot
    r = make_req("a", 7)
    _preload(lane, r)
    lane.add(r)
    free_before = lane.allocator.num_free_blocks
    lane.finish(r)
    assert lane.allocator.num_free_blocks == free_before + 1 and r.preloaded_block is None


def test_an_imported_prompt_whose_blocks_were_evicted_is_prefilled():
    lane = make_lane(num_blocks=6, block_size=4)
    r = make_req("a", 11)
    _preload(lane, r)
    other = lane.allocator.allocate(lane.allocator.num_free_blocks)  # other work evicts the cached full blocks
    lane.allocator.free(other)
    lane.add(r)
    part = lane.schedule_prefill()  # the prefix is gone: tail block dropped, ordinary prefill
    assert [(row.req_id, row.start_pos) for row in part.rows] == [("a", 0)]
    assert not r.is_kv_preloaded and r.preloaded_block is None and r.num_prefix_hit_tokens == 0
    assert lane.allocator.num_free_blocks == 6 - len(r.block_ids)  # the tail block went back
