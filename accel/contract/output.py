"""What an engine streams back: ``OutputDelta``s (with ``TokenLogprob``s) until one carries a
``FinishReason``."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from accel.contract.request import KVTransferParams


class FinishReason(str, enum.Enum):
    STOP = "stop"  # eos, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or max_model_len
    ABORT = "abort"  # client went away or the engine aborted it


@dataclass(frozen=True)
class TokenLogprob:
    """Logprob of one sampled token and its top alternatives (``top``: (token_id, logprob), best first)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int | None = None  # the token's rank in the vocabulary (1 = best), where the engine says


@dataclass(frozen=True)
class OutputDelta:
    """What one request gained since its previous delta.

    Token counts are cumulative; ``text`` is only the new text (stop strings already trimmed,
    never a broken UTF-8 sequence). The final delta has ``finish_reason`` set.
    """

    request_id: str
    new_token_ids: tuple[int, ...]
    text: str
    num_prompt_tokens: int
    num_completion_tokens: int
    num_cached_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] | None = None
    finish_reason: FinishReason | None = None
    # The stop string or stop token id that ended the request; None for eos, length or abort.
    stop_reason: str | int | None = None
    # Set on the final delta of a prefill-only (do_remote_decode) request.
    kv_transfer: KVTransferParams | None = None
    # On the first delta when the request asked for prompt_logprobs: one entry per prompt token
    # (None for the first, which has no context), ``top`` holding the prompt_logprobs best.
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def join_token_ids(deltas: Iterable[OutputDelta]) -> list[int]:
    """All completion token ids of a finished stream, in order."""
    return [t for d in deltas for t in d.new_token_ids]
