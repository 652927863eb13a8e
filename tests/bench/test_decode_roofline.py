"""bench/decode_roofline.py: the bytes one decode step reads, the roofline, the decode window."""

from __future__ import annotations

import pytest

from bench.decode_roofline import (
    decode_step_bytes,
    decode_window_tok_s,
    kv_bytes_per_token,
    roofline_tok_s,
    weight_bytes_per_step,
)

# SmolLM2-135M-Instruct's config.json (the keys the model reads).
SMOLLM2 = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "num_hidden_layers": 30,
    "tie_word_embeddings": True,
}
# Its safetensors holds 134,515,008 fp32 parameters (538,060,032 bytes of tensors), the tied
# embedding once.
SMOLLM2_PARAMS = 134_515_008


def test_a_step_reads_every_weight_once_and_the_embedding_rows_of_its_batch() -> None:
    assert weight_bytes_per_step(SMOLLM2, batch=1) == 4 * (SMOLLM2_PARAMS + 576)
    assert weight_bytes_per_step(SMOLLM2, batch=32) == 4 * (SMOLLM2_PARAMS + 32 * 576)
    assert weight_bytes_per_step(SMOLLM2, batch=1, dtype_bytes=2) == 2 * (SMOLLM2_PARAMS + 576)


def test_head_dim_defaults_to_hidden_over_heads() -> None:
    without = {k: v for k, v in SMOLLM2.items() if k != "head_dim"}
    assert weight_bytes_per_step(without, 1) == weight_bytes_per_step(SMOLLM2, 1)
    assert kv_bytes_per_token(without) == kv_bytes_per_token(SMOLLM2)


def test_the_kv_of_the_whole_batch_at_its_context_is_read_every_step() -> None:
    assert kv_bytes_per_token(SMOLLM2) == 2 * 30 * 3 * 64 * 4 == 46_080  # 45 KiB per token
    step = decode_step_bytes(SMOLLM2, batch=32, context_tokens=160)
    assert step == weight_bytes_per_step(SMOLLM2, 32) + 32 * 160 * 46_080
    assert decode_step_bytes(SMOLLM2, batch=8, context_tokens=0) == weight_bytes_per_step(SMOLLM2, 8)


def test_the_roofline_is_the_batch_times_the_steps_the_bandwidth_streams() -> None:
    assert roofline_tok_s(10e9, 500_000_000, batch=1) == pytest.approx(20.0)
    assert roofline_tok_s(10e9, 500_000_000, batch=8) == pytest.approx(160.0)


def test_the_decode_window_starts_when_every_request_has_its_first_token_and_ends_at_the_first_finish() -> None:
    # Two requests: A's prefill done at 1.0, B's at 2.0; A ends at 6.0, B at 7.0; one token per
    # request every 0.5 s once decoding.
    a = [1.0 + 0.5 * i for i in range(11)]  # 1.0 .. 6.0
    b = [2.0 + 0.5 * i for i in range(11)]  # 2.0 .. 7.0
    tok_s = decode_window_tok_s([a[0], b[0]], [a[-1], b[-1]], a + b)
    # (2.0, 6.0]: A's 8 tokens (2.5 .. 6.0) and B's 8 (2.5 .. 6.0) in 4 s.
    assert tok_s == pytest.approx(16 / 4.0)
    single = decode_window_tok_s([1.0], [3.0], [1.0, 1.5, 2.0, 2.5, 3.0])
    assert single == pytest.approx(4 / 2.0)  # the first token (prefill) is not decode


def test_no_window_when_a_request_finished_before_another_started_decoding() -> None:
    with pytest.raises(ValueError, match="output-len"):
        decode_window_tok_s([1.0, 5.0], [4.0, 9.0], [1.0, 4.0, 5.0, 9.0])
