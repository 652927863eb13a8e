"""Token-level stopping: eos, stop token ids, max_tokens, max_model_len, min_tokens."""

from __future__ import annotations

from dataclasses import dataclass

from accel.contract import FinishReason, SamplingParams


@dataclass(frozen=True)
class TokenStop:
    finish_reason: FinishReason
    stop_reason: int | None  # the stop token id; None for eos and length


def check_token_stop(
    token_id: int,
    num_output_tokens: int,
    num_prompt_tokens: int,
    sampling: SamplingParams,
    eos_token_ids: frozenset[int],
    max_model_len: int,
) -> TokenStop | None:
    """Decide whether generation ends after ``token_id``, the ``num_output_tokens``-th output token.

    eos and stop tokens are ignored until ``min_tokens`` outputs exist; eos is also ignored with
    ``ignore_eos``. The stopping token stays in the output token ids (it is counted as a
    completion token, as vLLM and HF do); special tokens are left out of the text.
    """
    if num_output_tokens > sampling.min_tokens:
        if token_id in eos_token_ids and not sampling.ignore_eos:
            return TokenStop(FinishReason.STOP, None)
        if token_id in sampling.stop_token_ids:
            return TokenStop(FinishReason.STOP, token_id)
    if sampling.max_tokens is not None and num_output_tokens >= sampling.max_tokens:
        return TokenStop(FinishReason.LENGTH, None)
    if num_prompt_tokens + num_output_tokens >= max_model_len:
        return TokenStop(FinishReason.LENGTH, None)
    return None
