"""DecodeMirror: which decode rows may read their mirrored context, and that a slot's new
occupant never reads the old one's (the case lengths and block ids alone cannot tell apart)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoConfig

from accel.tt.torch_model import TorchMeshModel
from accel.tt.torch_model.decode_mirror import DecodeMirror


def _mirror(lane_base):
    return DecodeMirror(1, 1, 32, 2, torch.float32, 4, lane_base)


def _rows(step):
    return [] if step.refill_rows is None else step.refill_rows.tolist()


def test_plan_refills_only_the_rows_whose_context_the_mirror_does_not_hold():
    table = np.array([[3, 4, 0, 0], [0, 0, 0, 0], [7, 8, 0, 0]], dtype=np.int64)
    m = _mirror(np.array([0, 0, 100], dtype=np.int64))  # slot 2 is in another lane; block size 4
    first = m.plan(np.array([5, -1, 2]), table)
    assert _rows(first) == [0, 2] and first.refill_len == 5 and first.refill_num_blocks == 2
    assert first.refill_blocks.tolist() == [3, 4, 107, 108]  # global ids, row-major
    assert _rows(m.plan(np.array([6, -1, 3]), table)) == []  # each row appended one token
    moved = table.copy()
    moved[0, 0] = 9  # a block the row already reads was replaced
    assert _rows(m.plan(np.array([7, -1, 4]), moved)) == [0]
    grown = moved.copy()
    grown[0, 2] = 6  # slot 0 reaches position 8: a new block past its held context is no change
    assert _rows(m.plan(np.array([8, -1, 5]), grown)) == []
    m.invalidate([2])
    assert _rows(m.plan(np.array([9, -1, 6]), grown)) == [2]
    assert _rows(m.plan(np.array([11, 3, 7]), grown)) == [0, 1]  # a skipped position; a new row
    assert _rows(m.plan(np.array([-1, 4, 8]), grown)) == []
    assert _rows(m.plan(np.array([13, 5, 9]), grown)) == [0]  # empty in a step: dropped


@pytest.fixture
def models(tiny_llama):
    config = AutoConfig.from_pretrained(tiny_llama)
    built = []
    for _ in range(2):
        model = TorchMeshModel.initialize_vllm_model(config, None, 2, max_seq_len=128)
        kv = model.allocate_kv_cache((8, 2, 16, 32), torch.float32, config.num_hidden_layers)
        built.append((model, kv))
    yield built
    for model, _ in built:
        model.close()


def _prefill(model, kv, slot, prompt, blocks):
    table = torch.tensor([blocks], dtype=torch.int32)
    tokens = torch.tensor([prompt])
    logits = model.prefill_forward(
        tokens=tokens, page_table=table, kv_cache=kv, prompt_lens=[len(prompt)], start_pos=[0], empty_slots=[slot]
    )
    return int(logits[0, 0].argmax())


def _decode(model, kv, slot, token, pos, blocks):
    tokens = torch.zeros(2, 1, dtype=torch.int64)
    start = torch.full((2,), -1, dtype=torch.int32)
    table = torch.zeros(2, 4, dtype=torch.int32)
    tokens[slot, 0], start[slot], table[slot, : len(blocks)] = token, pos, torch.tensor(blocks)
    return model.decode_forward(tokens=tokens, start_pos=start, page_table=table, kv_cache=kv)[slot, 0]


@pytest.mark.parametrize("mark", [True, False])
def test_a_new_occupant_at_the_next_position_in_the_same_blocks_reads_its_own_kv(models, mark):
    """Slot 0 decodes request A up to position 20 through blocks [0, 1]; then B, whose prompt KV
    was imported into the same blocks (written to the paged KV, as an import does, with no
    prefill here), decodes its last prompt token at position 21: the mirror's length and block
    ids both fit, only the engine's mark says the slot has a new occupant."""
    (model, kv), (ref, ref_kv) = models
    blocks = [0, 1]
    a, b = list(range(10, 30)), list(range(500, 522))
    first = _prefill(model, kv, 0, a, blocks)
    _decode(model, kv, 0, first, 20, blocks)
    # B's prompt KV, computed by another instance in the same blocks and copied in (the import)
    _prefill(ref, ref_kv, 0, b[:21], blocks)
    for (k, v), (rk, rv) in zip(kv[0], ref_kv[0]):
        k.copy_(rk)
        v.copy_(rv)
    expected = _decode(ref, ref_kv, 0, b[21], 21, blocks)
    if mark:
        model.use_host_inputs([0])
    got = _decode(model, kv, 0, b[21], 21, blocks)
    assert torch.equal(got, expected) == mark
