"""TTMeshEngine's KV side on the scripted mesh model: lane-tagged prefix-cache events and the
KV transfer hook points (export on finish, import before admission)."""

from __future__ import annotations

from accel.contract import GenerateRequest, KVTransferParams
from accel.tt.config import TTEngineConfig
from accel.tt.engine import TTMeshEngine
from accel.tt.engine_parts import build_engine_parts
from accel.tt.request_state import RequestState
from accel.tt.scripted_model import ScriptedMeshModel, expected_tokens
from accel.tt.step_plan import StepMode
from tests.accel.tt.engine_harness import assert_pool_full, greedy, make_engine, prompt_of, run_requests, tokens_of

VOCAB = 1024


def test_kv_events_carry_the_lane_that_changed(tiny_llama):
    engine = make_engine(
        tiny_llama, data_parallel_size=2, max_num_seqs=1, async_scheduling=False, num_gpu_blocks_override=16
    )
    try:
        prompt = prompt_of(4, 40)  # 2 full blocks of 16
        both = run_requests(engine, [GenerateRequest("a", prompt, greedy(2)), GenerateRequest("b", prompt, greedy(2))])
        assert tokens_of(both["a"]) == tokens_of(both["b"])
        events = engine.take_kv_events()
        stored: dict[int, list[int]] = {0: [], 1: []}
        for e in events:
            if e.kind == "stored":
                stored[e.lane] += e.block_hashes
        # each lane is its own cache: both cached the same 2 blocks, and each says so
        assert stored[0] == stored[1] and len(set(stored[0])) == 2
        assert set(engine.kv_block_snapshot()) == set(stored[0])  # the union of the lanes
        assert engine.take_kv_events() == []
    finally:
        engine.close()


class CellTransferHooks:
    """KV export/import through the hook points, moving the scripted model's KV cells."""

    def __init__(self, block_size):
        self.block_size = block_size
        self.model = None
        self.exported: dict[str, dict] = {}
        self.num_imported_blocks = 0

    def on_finished(self, r, lane_kv):
        kv = r.request.kv_transfer
        if kv is None or not kv.do_remote_decode:
            return None
        assert r.block_ids, "export runs before the blocks are freed"
        bs = self.block_size
        self.exported[r.req_id] = {
            p: self.model._cells[r.lane][(r.block_ids[p // bs], p % bs)] for p in range(r.num_prompt_tokens)
        }
        return KVTransferParams(do_remote_decode=True, transfer_id=f"t-{r.req_id}", num_tokens=r.num_prompt_tokens)

    async def prefetch(self, request):
        pass  # the cells are in this process: on_added reads them

    def may_import(self, r):
        kv = r.request.kv_transfer
        return kv is not None and kv.do_remote_prefill

    def on_added(self, r, allocator, lane_kv):
        if not self.may_import(r):
            return
        cells, bs = self.exported[r.request.kv_transfer.transfer_id[2:]], self.block_size
        r.update_block_hashes(bs)
        num_full = r.num_prompt_tokens // bs
        blocks = allocator.allocate(num_full)
        for p in range(num_full * bs):
            self.model._cells[r.lane][(blocks[p // bs], p % bs)] = cells[p]
        allocator.cache_blocks(blocks, r.block_hashes[:num_full])
        allocator.free(blocks)  # cached and free: admission takes them as a prefix hit
        self.num_imported_blocks += num_full


def test_kv_hook_points_export_and_import(tiny_llama):
    hooks = CellTransferHooks(block_size=16)
    engine = TTMeshEngine(
        TTEngineConfig.from_engine_args(
            dict(
                model=str(tiny_llama),
                max_num_seqs=2,
                data_parallel_size=2,
                block_size=16,
                max_model_len=256,
                max_num_batched_tokens=32,
                async_scheduling=True,
                additional_config={"tt": {"sample_on_device_mode": "all"}},
            )
        ),
        model_class=ScriptedMeshModel,
        keep_step_log=True,
        kv_hooks=hooks,
    )
    hooks.model = engine.model
    waits = []
    wait_idle = engine.core.queue.wait_idle
    engine.core.queue.wait_idle = lambda: (waits.append(1), wait_idle())[1]
    try:
        prompt = prompt_of(8, 50)
        pre = run_requests(
            engine, [GenerateRequest("pre", prompt, greedy(1), kv_transfer=KVTransferParams(do_remote_decode=True))]
        )["pre"]
        ticket = pre[-1].kv_transfer
        assert ticket is not None and ticket.transfer_id == "t-pre" and ticket.num_tokens == 50
        # Drop the prefill replica's own cache so only the import can give a hit.
        for lane in engine.core.coordinator.lanes:
            lane.allocator._cached.clear()
        dec = GenerateRequest(
            "dec", prompt, greedy(8), kv_transfer=KVTransferParams(do_remote_prefill=True, transfer_id="t-pre")
        )
        out = run_requests(engine, [dec])["dec"]
        assert tokens_of(out) == expected_tokens(prompt, 8, VOCAB)
        assert hooks.num_imported_blocks == 3 and out[-1].num_cached_tokens == 48
        computed = sum(
            n
            for rec in engine.step_log
            if rec.mode is StepMode.PREFILL
            for rows in rec.lane_rows
            for rid, _, n in rows
            if rid == "dec"
        )
        assert computed == 2
        # Nothing was in flight when either request came: neither the export nor the import waited.
        assert waits == []
        assert_pool_full(engine)
    finally:
        engine.close()


def test_an_import_waits_for_the_inflight_step_only_when_it_writes_a_free_block(tiny_llama):
    """The in-flight decode writes each row's KV at its position. While every such block is held
    by a live request, an import allocates around it and runs beside the step; once a row's
    request is aborted (its blocks free, the step still out), the next import waits for the step.
    Outputs stay exact either way. (The engine core driven by hand, as its step loop does.)"""
    hooks = CellTransferHooks(block_size=16)
    config = TTEngineConfig.from_engine_args(
        dict(
            model=str(tiny_llama),
            max_num_seqs=4,
            block_size=16,
            max_model_len=256,
            async_scheduling=True,
            additional_config={"tt": {"sample_on_device_mode": "all"}},
        )
    )
    parts = build_engine_parts(config, model_class=ScriptedMeshModel, kv_hooks=hooks)
    hooks.model = parts.model
    core = parts.core
    waits = []
    wait_idle = core.queue.wait_idle
    core.queue.wait_idle = lambda: (waits.append(1), wait_idle())[1]
    tokens: dict[str, list[int]] = {}

    def step():
        for d in core.step():
            tokens.setdefault(d.req_id, []).extend(d.token_ids)

    try:
        prompt, other = prompt_of(8, 50), prompt_of(3, 20)
        core.add_request(
            RequestState.new(
                GenerateRequest("pre", prompt, greedy(1), kv_transfer=KVTransferParams(do_remote_decode=True))
            )
        )
        while core.has_work():
            step()
        for name in ("a", "b"):
            core.add_request(RequestState.new(GenerateRequest(name, other, greedy(30))))
        while not core.queue.has_inflight:
            step()
        step()  # a decode of a and b is out
        assert not core._inflight_writes_free_block()
        imported = KVTransferParams(do_remote_prefill=True, transfer_id="t-pre")
        core.add_request(RequestState.new(GenerateRequest("dec1", prompt, greedy(8), kv_transfer=imported)))
        assert waits == [] and core.queue.has_inflight  # imported beside the step
        core.abort_request("b")  # b's blocks are free; the step writing b's KV is still out
        assert core._inflight_writes_free_block()
        core.add_request(RequestState.new(GenerateRequest("dec2", prompt, greedy(8), kv_transfer=imported)))
        assert len(waits) == 1
        while core.has_work():
            step()
        assert tokens["dec1"] == tokens["dec2"] == expected_tokens(prompt, 8, VOCAB)
        assert tokens["a"] == expected_tokens(other, 30, VOCAB)
        assert hooks.num_imported_blocks == 6
    finally:
        parts.close()
