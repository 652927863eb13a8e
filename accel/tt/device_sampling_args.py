"""A step's device sampling arguments: each request's ``SamplingParams`` normalized as §6 of the
tt-mesh reference says, laid out as tt-metal's ``TTSamplingParams`` (one list per field, one
entry per row; padding rows take ``PAD_DEFAULTS``), and a decode's penalty token histories."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import cast

import numpy as np
import torch

from accel.contract import SamplingParams
from accel.tt.mesh_model import TTSamplingParams
from accel.tt.sampling_rules import normalize_top_k
from accel.tt.step_plan import PENDING_TOKEN, RowPlan

_SAMPLING_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "num_logprobs",
    "enable_log_probs",
)
# One row of device sampling arguments, in ``_SAMPLING_FIELDS`` order.
SamplingRow = tuple[float, int, float, float, float, float, int | None, int, bool]
_PAD_ROW = cast(SamplingRow, tuple(TTSamplingParams.PAD_DEFAULTS[f] for f in _SAMPLING_FIELDS))


@lru_cache(maxsize=4096)
def device_sampling_row(sp: SamplingParams, vocab_size: int) -> SamplingRow:
    """§6 normalization of one request's device sampling arguments (``_SAMPLING_FIELDS`` order):
    an unseeded request's seed is None (tt-metal reads any int as an explicit seed);
    ``enable_log_probs`` is ``num_logprobs >= 0`` as the plugin sets it."""
    top_k = normalize_top_k(sp.top_k, vocab_size)
    if sp.is_greedy:
        temperature, top_k, top_p = 0.0, 1, 0.0
    else:
        temperature, top_p = float(sp.temperature), (0.0 if top_k == 1 else float(sp.top_p))
    num_logprobs = -2 if sp.logprobs is None else sp.logprobs
    return (
        temperature,
        top_k,
        top_p,
        float(sp.presence_penalty),
        float(sp.frequency_penalty),
        float(sp.repetition_penalty),
        sp.seed,
        num_logprobs,
        num_logprobs >= 0,
    )


def device_sampling_params(rows: Sequence[RowPlan], width: int, vocab_size: int, by_slot: bool) -> TTSamplingParams:
    """Device sampling lists of ``width`` rows: ``rows`` at their slot (``by_slot``, decode) or in
    plan order (prefill); the rest padding."""
    table = [_PAD_ROW] * width
    for i, r in enumerate(rows):
        table[r.row if by_slot else i] = device_sampling_row(r.sampling, vocab_size)
    columns = list(zip(*table))
    return TTSamplingParams(**{f: list(c) for f, c in zip(_SAMPLING_FIELDS, columns)})


def penalty_histories(rows: Sequence[RowPlan], width: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A decode's ``prompt_tokens`` / ``output_tokens`` for a device sampler's penalties, as
    vllm-tt-plugin builds them (e3fc849 ``InputBatch.make_prompt_token_ids_tensor`` /
    ``make_output_token_ids_tensor``): int32 ``[width, L]`` (row = slot), padded with -1 (the
    device sampler's sentinel). None when no row has penalties. Each row's history is prompt +
    outputs so far (``history_token_ids``, its pending token already fed); ``num_output_tokens``
    of them are outputs."""
    penalized = [r for r in rows if r.sampling.has_penalties and r.history_token_ids is not None]
    if not penalized:
        return None
    split = {}
    for r in penalized:
        history = r.history_token_ids
        assert history is not None and PENDING_TOKEN not in history, "a penalty history must be fed first"
        cut = len(history) - r.num_output_tokens
        split[r.row] = (history[:cut], history[cut:])
    prompt = np.full((width, max(len(p) for p, _ in split.values())), -1, dtype=np.int32)
    output = np.full((width, max(len(o) for _, o in split.values())), -1, dtype=np.int32)
    for row, (p, o) in split.items():
        prompt[row, : len(p)] = p
        output[row, : len(o)] = o
    return torch.from_numpy(prompt), torch.from_numpy(output)
