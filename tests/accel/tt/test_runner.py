"""MeshRunner: what goes on the wire (shapes, padding, slots) for decode and prefill."""

from __future__ import annotations

import torch

from accel.contract import SamplingParams
from accel.tt.config import TTEngineConfig, TTOptions
from accel.tt.mesh_model import SUPPORTS_SAMPLE_ON_DEVICE, TTSamplingParams
from accel.tt.runner import NO_TOKEN, MeshRunner
from accel.tt.sampling_policy import SamplingPolicy
from accel.tt.step_plan import PENDING_TOKEN, RowPlan, StepMode, StepPlan

VOCAB = 64


class RecordingModel:
    """Records every call; returns (tt-metal's conventions) logits ``[rows, 1, vocab]`` whose
    argmax is (row's last input token + 1), or those argmax tokens ``[rows]`` when sampling on
    device."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.calls = []

    def decode_forward(self, **kw):
        self.calls.append(("decode", kw))
        logits = torch.zeros(self.capacity, 1, VOCAB)
        logits[torch.arange(self.capacity), 0, (kw["tokens"][:, 0] + 1) % VOCAB] = 1.0
        if kw.get("sampling_params") is not None:
            return ("device", logits[:, 0].argmax(-1))
        return ("device", logits)

    def read_decode_output(self, tt_out, async_read=False):
        assert async_read
        return tt_out, []

    def process_decode_output_host(self, tt_out, is_tokens=False):
        assert tt_out[0] == "device" and is_tokens == (tt_out[1].dim() == 1)
        return tt_out[1]

    def prefill_forward(self, **kw):
        self.calls.append(("prefill", kw))
        n = kw["tokens"].shape[0]
        last = torch.tensor([int(kw["tokens"][i, kw["prompt_lens"][i] - 1]) for i in range(n)])
        logits = torch.zeros(n, 1, VOCAB)
        logits[torch.arange(n), 0, (last + 1) % VOCAB] = 1.0
        if kw.get("sampling_params") is not None:
            return logits[:, 0].argmax(-1)
        return logits


def make_runner(device_mode=None, lanes=2, per_lane=3):
    cfg = TTEngineConfig(model="x", max_num_seqs=per_lane, data_parallel_size=lanes, block_size=4, max_model_len=32)
    model = RecordingModel(cfg.max_num_seqs_global)
    policy = SamplingPolicy(device_mode, False, {SUPPORTS_SAMPLE_ON_DEVICE: True})
    return MeshRunner(model, "KV", cfg, policy, frozenset({1}), VOCAB), model


def row(rid, lane, slot, start, end, tokens, blocks, samples=True, **sp):
    return RowPlan(
        req_id=rid,
        lane=lane,
        row=slot,
        start_pos=start,
        end_pos=end,
        input_token_ids=tokens,
        block_ids=blocks,
        samples=samples,
        sampling=SamplingParams(temperature=0, **sp),
        num_output_tokens=0,
    )


def test_decode_carries_every_slot_with_empty_rows_at_minus_one():
    runner, model = make_runner()
    plan = StepPlan(1, StepMode.DECODE, 3, 2, (row("a", 0, 1, 5, 6, (10,), (7, 8)), row("b", 1, 3, 2, 3, (20,), (4,))))
    result = runner.submit(plan).finalize()
    kind, kw = model.calls[-1]
    assert kind == "decode" and runner.num_dispatches == 1
    assert kw["tokens"].shape == (6, 1) and kw["tokens"][:, 0].tolist() == [0, 10, 0, 20, 0, 0]
    assert kw["start_pos"].tolist() == [-1, 5, -1, 2, -1, -1]
    assert kw["page_table"].shape == (6, 8) and kw["page_table"].dtype == torch.int32
    assert kw["page_table"][1, :3].tolist() == [7, 8, 0] and kw["page_table"][3, 0] == 4
    assert kw["page_table"][[0, 2, 4, 5]].abs().sum() == 0
    assert kw["read_from_device"] is False and "sampling_params" not in kw
    assert result.token_ids == (11, 21) and not result.is_device_sampled
    # next step: "a" left; its page-table row must be zeroed again
    runner.submit(StepPlan(2, StepMode.DECODE, 3, 2, (row("b", 1, 3, 3, 4, (21,), (4,)),))).finalize()
    assert model.calls[-1][1]["page_table"][1].abs().sum() == 0


def test_each_decode_gets_its_own_page_table_and_tokens():
    """The host table persists across steps; the model must get a snapshot of it (a device
    reads the inputs of step N while the host builds step N+1)."""
    runner, model = make_runner()
    runner.submit(StepPlan(1, StepMode.DECODE, 3, 2, (row("a", 0, 1, 3, 4, (10,), (7,)),))).finalize()
    first = model.calls[-1][1]
    runner.submit(StepPlan(2, StepMode.DECODE, 3, 2, (row("a", 0, 1, 4, 5, (11,), (7, 9)),))).finalize()
    assert first["page_table"][1, :2].tolist() == [7, 0] and first["tokens"][1, 0] == 10
    assert model.calls[-1][1]["page_table"][1, :2].tolist() == [7, 9] and model.calls[-1][1]["tokens"][1, 0] == 11


def test_pending_tokens_are_fed_from_the_previous_step():
    runner, model = make_runner()
    plan = StepPlan(1, StepMode.DECODE, 3, 2, (row("a", 0, 0, 5, 6, (PENDING_TOKEN,), (1, 2)),))
    runner.submit(plan, fed_tokens={0: 33}).finalize()
    assert model.calls[-1][1]["tokens"][0, 0] == 33


class MarkingModel(RecordingModel):
    """Also records ``use_host_inputs`` (the optional call before a decode whose batch changed)."""

    def __init__(self, capacity):
        super().__init__(capacity)
        self.marked = []

    def use_host_inputs(self, slots):
        self.marked.append(sorted(slots))


def test_new_occupants_are_marked_and_every_row_when_sampling_moves_to_the_device():
    cfg = TTEngineConfig(model="x", max_num_seqs=3, data_parallel_size=1, block_size=4, max_model_len=32)
    model = MarkingModel(cfg.max_num_seqs_global)
    runner = MeshRunner(
        model, "KV", cfg, SamplingPolicy("all", False, {SUPPORTS_SAMPLE_ON_DEVICE: True}), frozenset({1}), VOCAB
    )

    def step(step_id, *rows):
        runner.submit(StepPlan(step_id, StepMode.DECODE, 3, 1, rows)).finalize()
        return model.marked.pop() if model.marked else None

    a, b = row("a", 0, 0, 5, 6, (10,), (1, 2)), row("b", 0, 1, 2, 3, (20,), (3,))
    assert step(1, a, b) == [0, 1]  # the first batch: every row
    assert step(2, a, b) is None  # same batch: nothing
    c = row("c", 0, 1, 7, 8, (30,), (4, 5))  # c takes b's slot; a stays
    assert step(3, a, c) == [1]
    logprobs = row("d", 0, 2, 3, 4, (40,), (6,), logprobs=1)  # logprobs: the batch samples on the host
    assert step(4, a, c, logprobs) == [2]
    assert step(5, a, c) == [0, 1]  # d left and sampling is back on the device: every row


def test_prefill_rows_are_front_packed_with_global_slots():
    runner, model = make_runner()
    plan = StepPlan(
        1,
        StepMode.PREFILL,
        3,
        2,
        (row("a", 0, 2, 0, 3, (5, 6, 7), (0,)), row("b", 1, 4, 4, 6, (1, 2, 3, 4, 5, 9), (3, 5), samples=False)),
    )
    result = runner.submit(plan).finalize()
    kind, kw = model.calls[-1]
    assert kind == "prefill"
    assert kw["tokens"].shape == (2, 6) and kw["tokens"][0].tolist() == [5, 6, 7, 0, 0, 0]
    assert kw["prompt_lens"] == [3, 6] and kw["start_pos"] == [0, 4] and kw["empty_slots"] == [2, 4]
    assert kw["page_table"][1, :2].tolist() == [3, 5]
    assert result.token_ids == (8, NO_TOKEN)


def test_device_sampling_params_are_padded_and_normalized():
    runner, model = make_runner(device_mode="all")
    plan = StepPlan(1, StepMode.DECODE, 3, 2, (row("a", 0, 1, 5, 6, (10,), (7,)),))
    result = runner.submit(plan).finalize()
    kw = model.calls[-1][1]
    sp: TTSamplingParams = kw["sampling_params"]
    assert result.is_device_sampled and result.token_ids == (11,)
    assert len(sp.temperature) == 6
    assert sp.top_k[0] == 1 and sp.temperature[0] == 0.0 and sp.seed[0] is None and sp.num_logprobs[0] == -2
    assert sp.enable_log_probs == [False] * 6
    assert (sp.temperature[1], sp.top_k[1], sp.top_p[1]) == (0.0, 1, 0.0)  # greedy row
    assert kw["reset_batch"] is True
    runner.submit(StepPlan(2, StepMode.DECODE, 3, 2, (row("a", 0, 1, 6, 7, (11,), (7,)),))).finalize()
    assert model.calls[-1][1]["reset_batch"] is False  # same layout


class MixinWarmupModel(RecordingModel):
    """tt-metal's ``WarmupForwardMixin`` signatures: ``kv_cache`` first, every argument required
    (a positional ``enable_trace`` would be 'multiple values for argument kv_cache')."""

    already_warmed_up_prefill = False

    def warmup_model_prefill(self, kv_cache, enable_trace, can_sample_on_device):
        self.calls.append(("warmup_prefill", dict(kv_cache=kv_cache, enable_trace=enable_trace)))
        self.already_warmed_up_prefill = True

    def warmup_model_decode(
        self, kv_cache, enable_trace, max_batch_size, num_blocks, can_sample_on_device, non_greedy_decoding_on_device
    ):
        self.calls.append(("warmup_decode", dict(enable_trace=enable_trace, non_greedy=non_greedy_decoding_on_device)))


def test_warmup_calls_by_keyword_compile_then_capture():
    cfg = TTEngineConfig(
        model="x",
        max_num_seqs=3,
        data_parallel_size=2,
        block_size=4,
        max_model_len=32,
        tt=TTOptions.from_mapping({"sample_on_device_mode": "decode_only"}),
    )
    model = MixinWarmupModel(cfg.max_num_seqs_global)
    policy = SamplingPolicy("decode_only", False, {SUPPORTS_SAMPLE_ON_DEVICE: True})
    MeshRunner(model, "KV", cfg, policy, frozenset({1}), VOCAB).warmup()
    assert [(name, kw["enable_trace"]) for name, kw in model.calls] == [
        ("warmup_prefill", False),
        ("warmup_decode", False),
        ("warmup_prefill", True),
        ("warmup_decode", True),
    ]
    assert all(kw["non_greedy"] is True for name, kw in model.calls if name == "warmup_decode")
    assert model.calls[0][1]["kv_cache"] == "KV"
