"""TorchMeshModel against HF transformers: greedy through page tables in several lanes, chunked
prefill, empty rows, seeded sampling, async read-back, warmup shapes."""

from __future__ import annotations

import threading

import pytest
import torch

from accel.tt.mesh_model import MeshModel, TTSamplingParams
from accel.tt.torch_model import TorchMeshModel
from accel.tt.torch_model.config import DecoderConfig
from accel.tt.torch_model.linear import can_pack
from accel.tt.torch_model.weights import load_weights
from tests.hf_reference import hf_greedy

NUM_LANES, PER_LANE = 2, 3
B_WIRE = NUM_LANES * PER_LANE
BLOCK_SIZE, NUM_BLOCKS, MAX_BLOCKS_PER_REQ = 16, 12, 8
MAX_SEQ_LEN = BLOCK_SIZE * MAX_BLOCKS_PER_REQ


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_qwen3"])
def model_dir(request):
    return request.getfixturevalue(request.param)


# "packed": the projections as this CPU runs them by default (oneDNN-packed where torch has
# oneDNN); "dense": F.linear, what CUDA and oneDNN-less builds run.
@pytest.fixture(scope="module", params=["packed", "dense"])
def model(model_dir, request):
    from transformers import AutoConfig

    torch.set_num_threads(1)
    hf_config = AutoConfig.from_pretrained(model_dir)
    if request.param == "packed":
        m = TorchMeshModel.initialize_vllm_model(
            hf_config, None, B_WIRE, max_seq_len=MAX_SEQ_LEN, tt_data_parallel=NUM_LANES
        )
        assert m.weights.lm_head.packed is not None or not can_pack(m.device, m.dtype)
    else:
        config = DecoderConfig.from_hf(hf_config)
        device = torch.device("cpu")
        weights = load_weights(model_dir, config, device, torch.float32, pack_linear=False)
        m = TorchMeshModel(
            config,
            weights,
            max_batch_size=B_WIRE,
            max_seq_len=MAX_SEQ_LEN,
            num_lanes=NUM_LANES,
            device=device,
            dtype=torch.float32,
        )
        assert m.weights.lm_head.packed is None
    yield m
    m.close()


@pytest.fixture()
def kv(model):
    return model.allocate_kv_cache((NUM_BLOCKS, 2, BLOCK_SIZE, 32), torch.float32, 4)


def sampling(rows: int, **overrides) -> TTSamplingParams:
    values = {k: [v] * rows for k, v in TTSamplingParams.PAD_DEFAULTS.items()}
    for key, per_row in overrides.items():
        values[key] = list(per_row)
    values["enable_log_probs"] = [n >= 0 for n in values["num_logprobs"]]
    return TTSamplingParams(**values)


class Requests:
    """Drives the model like the engine: fixed slots, lane-local blocks, full-width decode."""

    def __init__(self, model: TorchMeshModel, kv, prompts: dict[int, list[int]]):
        self.model, self.kv, self.prompts = model, kv, prompts
        self.page_table = torch.zeros(B_WIRE, MAX_BLOCKS_PER_REQ, dtype=torch.int32)
        next_free = [NUM_BLOCKS - 1] * NUM_LANES  # hand blocks out from the top: ids differ per lane
        for slot in sorted(prompts):
            lane = slot // PER_LANE
            for j in range(MAX_BLOCKS_PER_REQ // 2 + 1):
                self.page_table[slot, j] = next_free[lane]
                next_free[lane] -= 1
        self.outputs: dict[int, list[int]] = {s: [] for s in prompts}
        self.num_computed = {s: 0 for s in prompts}

    def prefill(self, slots: list[int], chunk_tokens: int | None = None, **kw) -> object:
        ends = [
            len(self.prompts[s])
            if chunk_tokens is None
            else min(len(self.prompts[s]), self.num_computed[s] + chunk_tokens)
            for s in slots
        ]
        width = max(ends)
        tokens = torch.full((len(slots), width), 2, dtype=torch.int64)
        for i, s in enumerate(slots):
            tokens[i, : ends[i]] = torch.tensor(self.prompts[s][: ends[i]])
        out = self.model.prefill_forward(
            tokens,
            self.page_table[slots],
            self.kv,
            prompt_lens=ends,
            start_pos=[self.num_computed[s] for s in slots],
            empty_slots=slots,
            **kw,
        )
        for s, end in zip(slots, ends):
            self.num_computed[s] = end
        return out

    def decode_inputs(self, active: list[int]):
        tokens = torch.zeros(B_WIRE, 1, dtype=torch.int64)
        start_pos = torch.full((B_WIRE,), -1, dtype=torch.int32)
        table = torch.zeros_like(self.page_table)
        for s in active:
            tokens[s, 0] = self.outputs[s][-1]
            start_pos[s] = len(self.prompts[s]) + len(self.outputs[s]) - 1
            table[s] = self.page_table[s]
        return tokens, start_pos, table


def test_satisfies_protocol(model):
    assert isinstance(model, MeshModel)
    assert model.model_capabilities["max_device_top_k"] == 32
    assert all(
        model.model_capabilities[k]
        for k in ("supports_prefix_caching", "supports_async_decode", "supports_sample_on_device")
    )
    assert len(model.allocate_kv_cache((NUM_BLOCKS, 2, BLOCK_SIZE, 32), torch.float32, 4)) == NUM_LANES


def test_kv_cache_is_per_lane_views(model, kv):
    assert len(kv) == NUM_LANES and all(len(lane) == 4 for lane in kv)
    k0, k1 = kv[0][0][0], kv[1][0][0]
    assert k0.shape == (NUM_BLOCKS, 2, BLOCK_SIZE, 32) and k0.data_ptr() != k1.data_ptr()
    with pytest.raises(ValueError):
        model.allocate_kv_cache((NUM_BLOCKS, 3, BLOCK_SIZE, 32), torch.float32, 4)


def test_greedy_in_several_lanes_matches_hf(model, model_dir, kv):
    prompts = {0: [0, 5, 17, 99, 300], 2: [0] + list(range(40, 77)), 3: [0, 11], 5: [0, 9, 8, 7, 6, 5, 4] * 5}
    num_new = 10
    run = Requests(model, kv, prompts)
    logits = run.prefill(sorted(prompts))
    assert logits.shape == (len(prompts), 1, 1024)
    for i, s in enumerate(sorted(prompts)):
        run.outputs[s].append(int(logits[i, 0].argmax()))
    for _ in range(num_new - 1):
        out = model.decode_forward(*run.decode_inputs(sorted(prompts)), kv_cache=kv)
        assert out.shape == (B_WIRE, 1, 1024)  # tt-metal's decode logits
        for s in prompts:
            run.outputs[s].append(int(out[s, -1].argmax()))
    for s, prompt in prompts.items():
        assert run.outputs[s] == hf_greedy(model_dir, prompt, num_new), f"slot {s}"


def test_chunked_prefill_and_prefix_reuse_match_hf(model, model_dir, kv):
    prompt = [0] + [(i * 37) % 1000 + 3 for i in range(70)]
    run = Requests(model, kv, {4: prompt})
    while run.num_computed[4] < len(prompt):
        logits = run.prefill([4], chunk_tokens=32)  # start_pos > 0, prompt_lens < len(prompt)
    run.outputs[4].append(int(logits[0, 0].argmax()))
    for _ in range(5):
        out = model.decode_forward(*run.decode_inputs([4]), kv_cache=kv, read_from_device=True)
        run.outputs[4].append(int(out[4, -1].argmax()))
    assert run.outputs[4] == hf_greedy(model_dir, prompt, 6)


def test_empty_rows_do_not_disturb_others(model, kv):
    prompts = {1: [0, 3, 4, 5, 6], 4: [0, 7, 8, 9]}
    run = Requests(model, kv, prompts)
    first = run.prefill([1, 4])
    for i, s in enumerate([1, 4]):
        run.outputs[s].append(int(first[i, 0].argmax()))
    tokens, start_pos, table = run.decode_inputs([1, 4])
    kv_before = [t.clone() for lane in kv for layer in lane for t in layer]
    clean = model.decode_forward(tokens.clone(), start_pos.clone(), table.clone(), kv)
    # Same step again with garbage in every empty row: written slots get identical values,
    # empty rows (start_pos -1) write nothing, live rows' logits are unchanged.
    tokens[[0, 2, 3, 5], 0] = 999
    table[[0, 2, 3, 5]] = 1
    noisy = model.decode_forward(tokens, start_pos, table, kv)
    assert torch.equal(clean[[1, 4]], noisy[[1, 4]])
    changed = [not torch.equal(a, b) for a, b in zip(kv_before, (t for lane in kv for layer in lane for t in layer))]
    assert any(changed)  # the live rows did write their token's KV
    free_block = NUM_BLOCKS - 1 - (MAX_BLOCKS_PER_REQ // 2 + 1)  # never handed out in lane 0
    assert torch.count_nonzero(kv[0][0][0][free_block]) == 0


def test_seeded_sampling_reproduces_and_greedy_defaults(model, kv):
    prompts = {0: [0, 5, 6], 3: [0, 5, 6]}
    params = sampling(2, temperature=[1.5, 1.5], top_k=[0, 0], top_p=[0.95, 0.95], seed=[7, 7], num_logprobs=[0, 0])
    a = Requests(model, kv, prompts).prefill([0, 3], sampling_params=params)
    b = Requests(model, kv, prompts).prefill([0, 3], sampling_params=params)
    # enable_log_probs: tt-metal's (tokens, logprobs) tuple
    assert isinstance(a, tuple) and len(a) == 2 and a[0].shape == (2,) and a[1].shape == (2,)
    assert torch.equal(a[0], b[0])  # same seed, same position -> same token
    assert a[0][0] == a[0][1]  # independent of slot and lane
    assert bool((a[1] <= 0).all())
    greedy = Requests(model, kv, prompts).prefill([0, 3], sampling_params=sampling(2))
    logits = Requests(model, kv, prompts).prefill([0, 3])
    assert isinstance(greedy, torch.Tensor) and greedy.shape == (2,)  # no log probs: a plain [B] tensor
    assert greedy.tolist() == logits[:, 0].argmax(-1).tolist()


def test_top_k_and_top_p_restrict_candidates(model, kv):
    prompts = {s: [0, 5, 6] for s in range(B_WIRE)}
    logits = Requests(model, kv, prompts).prefill(list(range(B_WIRE)))[:, 0]
    top2 = logits.topk(2, dim=-1).indices
    draws = set()
    for seed in range(3):
        out = Requests(model, kv, prompts).prefill(
            list(range(B_WIRE)),
            sampling_params=sampling(
                B_WIRE, temperature=[5.0] * B_WIRE, top_k=[2] * B_WIRE, seed=[seed * 10 + r for r in range(B_WIRE)]
            ),
        )
        for r in range(B_WIRE):
            assert int(out[r]) in top2[r].tolist()
            draws.add(int(out[r]))
    assert len(draws) > 1  # temperature 5 over two candidates: both show up
    nucleus = Requests(model, kv, prompts).prefill(
        list(range(B_WIRE)),
        sampling_params=sampling(B_WIRE, temperature=[1.0] * B_WIRE, top_k=[-1] * B_WIRE, top_p=[1e-6] * B_WIRE),
    )
    assert nucleus.tolist() == logits.argmax(-1).tolist()


def test_async_decode_equals_sync_and_really_runs_on_the_queue(model, kv):
    prompts = {1: [0, 3, 4, 5], 5: [0, 8, 1, 2, 9]}
    runs = []
    for is_async in (False, True):
        run = Requests(model, kv, prompts)
        first = run.prefill([1, 5], sampling_params=sampling(2))
        for i, s in enumerate([1, 5]):
            run.outputs[s].append(int(first[i]))
        for _ in range(4):
            inputs = run.decode_inputs([1, 5])
            params = sampling(
                B_WIRE, seed=[3] * B_WIRE, temperature=[0.7] * B_WIRE, top_k=[20] * B_WIRE, num_logprobs=[1] * B_WIRE
            )
            if is_async:
                handle = model.decode_forward(*inputs, kv_cache=kv, read_from_device=False, sampling_params=params)
                out, events = model.read_decode_output(handle, async_read=True)
                assert len(events) == 1
                for ev in events:
                    ev.synchronize()
                result = model.process_decode_output_host(out, is_tokens=True)
            else:
                result = model.decode_forward(*inputs, kv_cache=kv, sampling_params=params)
            tokens, logprobs = result
            assert tokens.shape == (B_WIRE,) and logprobs.shape == (B_WIRE,)
            for s in (1, 5):
                run.outputs[s].append(int(tokens[s]))
        runs.append(run.outputs)
    assert runs[0] == runs[1]


def test_decode_submit_returns_before_the_forward_runs(model, kv):
    gate = threading.Event()
    model._queue.submit(gate.wait)  # occupy the device queue
    handle = model.decode_forward(
        torch.zeros(B_WIRE, 1, dtype=torch.int64),
        torch.full((B_WIRE,), -1),
        torch.zeros(B_WIRE, MAX_BLOCKS_PER_REQ, dtype=torch.int32),
        kv,
        read_from_device=False,
    )
    assert not handle.future.done()
    gate.set()
    _, events = model.read_decode_output(handle, async_read=True)
    events[0].synchronize()
    assert model.process_decode_output_host(handle).shape == (B_WIRE, 1, 1024)


def test_kv_dtype_must_be_a_torch_dtype(model):
    """tt-metal allocates ``torch.zeros(shape, dtype=dtype)``: a ttnn dtype is a contract error."""
    with pytest.raises(TypeError, match="torch floating dtype"):
        model.allocate_kv_cache((NUM_BLOCKS, 2, BLOCK_SIZE, 32), "bfloat8_b", 4)


def test_decode_requires_full_slot_batch(model, kv):
    with pytest.raises(ValueError, match="full slot batch"):
        model.decode_forward(
            torch.zeros(2, 1, dtype=torch.int64),
            torch.tensor([0, -1]),
            torch.zeros(2, MAX_BLOCKS_PER_REQ, dtype=torch.int32),
            kv,
        )
    with pytest.raises(ValueError, match="allocate_kv_cache"):
        model.decode_forward(
            torch.zeros(B_WIRE, 1, dtype=torch.int64),
            torch.full((B_WIRE,), -1),
            torch.zeros(B_WIRE, MAX_BLOCKS_PER_REQ, dtype=torch.int32),
            [[[torch.zeros(1)] * 2] * 4] * NUM_LANES,
        )


def test_warmup_runs_each_bucket_once(model, kv):
    model.captured_shapes.clear()
    model.warmup_model_prefill(enable_trace=True, kv_cache=kv, can_sample_on_device=True)
    model.warmup_model_decode(
        enable_trace=True, kv_cache=kv, max_batch_size=B_WIRE, num_blocks=MAX_BLOCKS_PER_REQ, can_sample_on_device=True
    )
    prefill = [(shape, v) for phase, shape, v in model.captured_shapes if phase == "prefill"]
    decode = [(shape, v) for phase, shape, v in model.captured_shapes if phase == "decode"]
    assert prefill == [((1, 128), "logits"), ((1, 128), "sampled")]  # max_seq_len 128: one bucket
    assert [s for s, _ in decode] == [(B_WIRE, 1, MAX_BLOCKS_PER_REQ)] * 4
    assert all(torch.count_nonzero(t) == 0 for lane in kv for layer in lane for t in layer)  # no KV written


def test_block_ids_and_slots_are_validated(model, kv):
    table = torch.zeros(B_WIRE, MAX_BLOCKS_PER_REQ, dtype=torch.int32)
    table[2, 1] = NUM_BLOCKS  # one past the lane's last block: would be the next lane's memory
    start_pos = torch.full((B_WIRE,), -1)
    start_pos[2] = BLOCK_SIZE  # reads blocks 0 and 1
    with pytest.raises(ValueError, match="row 2 holds block ids outside"):
        model.decode_forward(torch.zeros(B_WIRE, 1, dtype=torch.int64), start_pos, table, kv)
    start_pos[2] = 3  # reads block 0 only: the bad id beyond is never touched
    model.decode_forward(torch.zeros(B_WIRE, 1, dtype=torch.int64), start_pos, table, kv)
    with pytest.raises(ValueError, match="empty_slots"):
        model.prefill_forward(torch.zeros(1, 4, dtype=torch.int64), table[:1], kv, [4], [0], [B_WIRE])
    bad_row = table[2:3].clone()  # a prefill chunk reaching that block is refused the same way
    with pytest.raises(ValueError, match="row 0 holds block ids outside"):
        model.prefill_forward(
            torch.zeros(1, BLOCK_SIZE + 1, dtype=torch.int64), bad_row, kv, [BLOCK_SIZE + 1], [0], [2]
        )
    with pytest.raises(ValueError, match="bad prefill chunk"):
        model.prefill_forward(torch.zeros(1, 4, dtype=torch.int64), table[:1], kv, [4], [4], [0])


def test_rows_are_padded_to_their_own_bucket_and_match_hf(tiny_llama, monkeypatch):
    """tt-metal pads each prefill user to its own ``get_padded_prefill_len``: one 129-token prompt
    in a step must not pad the other rows to 256. Each bucket's rows run as one group; outputs
    come back in the caller's row order and equal HF greedy."""
    from transformers import AutoConfig

    from accel.tt.torch_model import model as model_module

    block, blocks_per_req, rows = 16, 16, 3
    m = TorchMeshModel.initialize_vllm_model(
        AutoConfig.from_pretrained(tiny_llama), None, rows, max_seq_len=block * blocks_per_req, tt_data_parallel=1
    )
    try:
        kv = m.allocate_kv_cache((rows * blocks_per_req, 2, block, 32), torch.float32, 4)
        prompts = [
            [0] + [(i * 31) % 900 + 3 for i in range(99)],  # 100 tokens -> bucket 128
            [0] + [(i * 17) % 900 + 5 for i in range(140)],  # 141 tokens -> bucket 256
            [0] + [(i * 7) % 900 + 4 for i in range(127)],  # 128 tokens -> bucket 128
        ]
        table = torch.arange(rows * blocks_per_req, dtype=torch.int32).reshape(rows, blocks_per_req)
        tokens = torch.zeros(rows, max(map(len, prompts)), dtype=torch.int64)
        for i, p in enumerate(prompts):
            tokens[i, : len(p)] = torch.tensor(p)
        widths: list[tuple[int, ...]] = []  # [n, L] of each decoder_forward call's tokens
        real_forward = model_module.decoder_forward

        def recording_forward(*args, **kwargs):
            widths.append(tuple(args[5].shape))
            return real_forward(*args, **kwargs)

        monkeypatch.setattr(model_module, "decoder_forward", recording_forward)
        lens = [len(p) for p in prompts]
        logits = m.prefill_forward(tokens, table, kv, prompt_lens=lens, start_pos=[0] * rows, empty_slots=[0, 1, 2])
        assert sorted(widths) == [(1, 256), (2, 128)]
        outputs = [[int(logits[i, 0].argmax())] for i in range(rows)]
        for _ in range(4):
            step_tokens = torch.tensor([[o[-1]] for o in outputs])
            start = torch.tensor([lens[i] + len(outputs[i]) - 1 for i in range(rows)])
            out = m.decode_forward(step_tokens, start, table, kv_cache=kv)
            for i in range(rows):
                outputs[i].append(int(out[i, -1].argmax()))
        for i, p in enumerate(prompts):
            assert outputs[i] == hf_greedy(tiny_llama, p, 5), f"row {i}"
    finally:
        m.close()
