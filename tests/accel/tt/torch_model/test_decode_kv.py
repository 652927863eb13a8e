"""Decode-resident KV rows: decode reads the same context as the paged path, bit for bit, across
the events that change a slot's pages (prefill into a reused slot, a skipped step, pages moved
under a slot through the cache views, a prefix-hit prefill of only the last prompt token)."""

from __future__ import annotations

import pytest
import torch

import accel.tt.torch_model.decode_kv as decode_kv
from accel.tt.torch_model import TorchMeshModel

NUM_LANES, PER_LANE = 2, 3
B_WIRE = NUM_LANES * PER_LANE
BLOCK_SIZE, NUM_BLOCKS, WIDTH = 16, 12, 8


@pytest.fixture(scope="module")
def model(tiny_llama):
    from transformers import AutoConfig

    torch.set_num_threads(1)
    m = TorchMeshModel.initialize_vllm_model(
        AutoConfig.from_pretrained(tiny_llama), None, B_WIRE, max_seq_len=BLOCK_SIZE * WIDTH, tt_data_parallel=NUM_LANES
    )
    yield m
    m.close()


def _prefill(model, kv, table, slot, prompt, start=0):
    tokens = torch.tensor([prompt], dtype=torch.int64)
    out = model.prefill_forward(tokens, table[[slot]], kv, [len(prompt)], start_pos=[start], empty_slots=[slot])
    return int(out[0, -1].argmax())


def _decode(model, kv, table, positions: dict[int, int], tokens: dict[int, int]):
    tok = torch.zeros(B_WIRE, 1, dtype=torch.int64)
    pos = torch.full((B_WIRE,), -1, dtype=torch.int32)
    for slot, p in positions.items():
        tok[slot, 0], pos[slot] = tokens[slot], p
    logits = model.decode_forward(tok, pos, table, kv)[:, 0]
    return logits, {slot: int(logits[slot].argmax()) for slot in positions}


def _scenario(model) -> list[torch.Tensor]:
    kv = model.allocate_kv_cache((NUM_BLOCKS, 2, BLOCK_SIZE, 32), torch.float32, 4)
    table = torch.zeros(B_WIRE, WIDTH, dtype=torch.int32)
    table[0, :4] = torch.tensor([5, 2, 9, 0])  # lane 0
    table[1, :4] = torch.tensor([1, 7, 3, 4])
    table[3, :4] = torch.tensor([5, 2, 9, 0])  # lane 1: same ids, other memory
    prompts = {0: list(range(3, 23)), 1: list(range(40, 73)), 3: list(range(100, 107))}
    nxt = {s: _prefill(model, kv, table, s, p) for s, p in prompts.items()}
    pos = {s: len(p) for s, p in prompts.items()}
    seen = []

    def step(slots):
        logits, out = _decode(model, kv, table, {s: pos[s] for s in slots}, nxt)
        seen.append(logits[list(slots)])
        for s in slots:
            nxt[s], pos[s] = out[s], pos[s] + 1

    for _ in range(4):
        step((0, 1, 3))
    step((0, 3))  # slot 1 skipped: its row's position 0 is scribbled on
    step((0, 1, 3))
    # Slot 0 gets a new request as long as the old one's context, on the same
    # blocks (so only the prefill's invalidation tells the rows are stale).
    assert pos[0] == 26
    table[0].zero_()
    table[0, :2] = torch.tensor([5, 2])
    nxt[0], pos[0] = _prefill(model, kv, table, 0, list(range(200, 226))), 26
    step((0, 1, 3))
    # Slot 3's pages move to other block ids through the cache views, no prefill; the new pages
    # hold other values, which the rows must pick up.
    used = (pos[3] + BLOCK_SIZE - 1) // BLOCK_SIZE
    new_ids = [11, 10, 8, 7][:used]
    for layer_kv in kv[1]:
        for t in layer_kv:
            t[new_ids] = t[table[3, :used].tolist()] * 0.5
    table[3, :used] = torch.tensor(new_ids)
    step((0, 1, 3))
    # Slot 5 (lane 1) hits the prefix slot 4 computed: only its last prompt token is prefilled.
    prompt = list(range(300, 318))
    table[4, :2] = table[5, :2] = torch.tensor([1, 3])
    _prefill(model, kv, table, 4, prompt)
    nxt[5], pos[5] = _prefill(model, kv, table, 5, prompt, start=len(prompt) - 1), len(prompt)
    for _ in range(3):
        step((0, 1, 3, 5))
    return seen


def test_resident_decode_equals_paged_decode(model, monkeypatch):
    resident_logits = _scenario(model)
    assert model._resident is not None and model._resident.capacity > 0
    monkeypatch.setattr(decode_kv, "MAX_RESIDENT_BYTES", 0)  # every decode takes the paged path
    paged_logits = _scenario(model)
    assert model._resident.capacity == 0
    assert len(resident_logits) == len(paged_logits) == 11
    for a, b in zip(resident_logits, paged_logits):
        assert torch.equal(a, b)


def test_rows_past_the_byte_budget_fall_back_to_pages(model, monkeypatch):
    kv = model.allocate_kv_cache((NUM_BLOCKS, 2, BLOCK_SIZE, 32), torch.float32, 4)
    resident = model._resident
    assert resident is not None
    monkeypatch.setattr(decode_kv, "MAX_RESIDENT_BYTES", resident.bytes_for(1) - 1)
    table = torch.zeros(B_WIRE, WIDTH, dtype=torch.int32)
    table[2, :2] = torch.tensor([4, 5])
    first = _prefill(model, kv, table, 2, list(range(10, 30)))
    _decode(model, kv, table, {2: 20}, {2: first})
    assert resident.capacity == 0 and int(resident.valid[2]) == -1
