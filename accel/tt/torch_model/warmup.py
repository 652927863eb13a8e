"""The torch mesh program's fixed shapes and its warmup ("trace capture").

Shapes: decode always runs the full slot batch; prefill pads each row's chunk length to its
bucket (<= 128 -> 128, else the next power of two; rows of one bucket run together); attention
reads the group's longest context rounded up to ``CTX_TOKEN_ALIGN`` keys. Warmup runs each shape
once (every prefill bucket up to ``max_seq_len`` at batch 1, the full-width decode) with each
sampling variant the engine may ask for, writing no KV, and records it in
``model.captured_shapes``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from accel.tt.mesh_model import MAX_DEVICE_TOP_K, TTSamplingParams
from accel.tt.torch_model.decoder import decoder_forward
from accel.tt.torch_model.paged_attention import PagedKVStore
from accel.tt.torch_model.sampler import PreparedSampling, prepare_sampling, sample

if TYPE_CHECKING:
    from accel.tt.torch_model.model import TorchMeshModel

logger = logging.getLogger(__name__)

MIN_PREFILL_BUCKET_TOKENS = 128
# Attention reads the longest row's context rounded up to this many keys, not to whole blocks
# (its cost is linear in the key count); few distinct shapes, no partial-vector tails.
CTX_TOKEN_ALIGN = 16


def prefill_bucket(num_tokens: int) -> int:
    """Padded prefill length: <= 128 -> 128, else the next power of two."""
    return MIN_PREFILL_BUCKET_TOKENS if num_tokens <= MIN_PREFILL_BUCKET_TOKENS else 1 << (num_tokens - 1).bit_length()


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def warm_prefill(model: TorchMeshModel, store: PagedKVStore, enable_trace: bool, can_sample_on_device: bool) -> None:
    """Runs every prefill bucket (128 .. max_seq_len) once, batch 1; writes only the scratch block."""
    variants = ["logits"] + (["sampled"] if can_sample_on_device else [])
    length = MIN_PREFILL_BUCKET_TOKENS
    while True:
        num_blocks = next_pow2(-(-length // store.block_size))
        _warm(
            model,
            store,
            tokens=torch.zeros(1, length, dtype=torch.int64),
            positions=torch.arange(length)[None, :],
            table=torch.zeros(1, num_blocks, dtype=torch.int64),  # reads lane 0 block 0 only
            last_index=torch.tensor([length - 1]),
            variants=variants,
        )
        for variant in variants:
            _log_capture(model, "prefill", (1, length), variant, enable_trace)
        if length >= model.max_seq_len:
            break
        length *= 2


def warm_decode(
    model: TorchMeshModel, store: PagedKVStore, enable_trace: bool, num_blocks: int, can_sample_on_device: bool
) -> None:
    """Runs the full-width decode (every slot empty: no KV write) and each sampling variant."""
    batch = model.max_batch_size
    variants = ["logits"] + (["greedy", "sampled", "sampled+logprobs"] if can_sample_on_device else [])
    _warm(
        model,
        store,
        tokens=torch.zeros(batch, 1, dtype=torch.int64),
        positions=torch.zeros(batch, 1, dtype=torch.int64),
        table=torch.zeros(batch, num_blocks, dtype=torch.int64),
        last_index=torch.zeros(batch, dtype=torch.int64),
        variants=variants,
    )
    for variant in variants:
        _log_capture(model, "decode", (batch, 1, num_blocks), variant, enable_trace)


def _warm(
    model: TorchMeshModel,
    store: PagedKVStore,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    table: torch.Tensor,
    last_index: torch.Tensor,
    variants: list[str],
) -> None:
    """One forward of the shape (nothing written: ``is_written`` all False), then each sampler tail."""
    rows = tokens.shape[0]
    lanes = torch.arange(rows) // model.per_lane

    def program() -> None:
        logits = decoder_forward(
            model.config,
            model.weights,
            model.rope,
            model.device,
            store,
            tokens,
            positions,
            torch.zeros_like(tokens, dtype=torch.bool),
            lanes,
            table,
            table.shape[1],
            last_index,
        )
        for variant in variants[1:]:
            sample(
                logits,
                _warmup_sampling(rows, variant, model.config.vocab_size, model.device),
                model.generator,
                model.model_capabilities[MAX_DEVICE_TOP_K],
            )

    model._queue.run(program)


def _log_capture(model: TorchMeshModel, phase: str, shape: tuple[int, ...], variant: str, enable_trace: bool) -> None:
    mode = "captured" if enable_trace else "compiled"
    model.captured_shapes.append((phase, shape, variant))
    logger.info("%s %s shape %s (%s, eager on %s)", mode, phase, shape, variant, model.device)


def _warmup_sampling(rows: int, variant: str, vocab_size: int, device: torch.device) -> PreparedSampling:
    greedy = variant == "greedy"
    params = TTSamplingParams(
        temperature=[0.0 if greedy else 0.8] * rows,
        top_k=[1 if greedy else 32] * rows,
        top_p=[1.0 if greedy else 0.9] * rows,
        presence_penalty=[0.0] * rows,
        frequency_penalty=[0.0] * rows,
        repetition_penalty=[1.0] * rows,
        seed=[None] * rows,
        num_logprobs=[1 if variant.endswith("logprobs") else -2] * rows,
        enable_log_probs=[variant.endswith("logprobs")] * rows,
    )
    return prepare_sampling(params, [0] * rows, vocab_size, device)
