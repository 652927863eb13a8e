"""Per-request sampling and stopping: ``SamplingParams``, spelled as vLLM's."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from accel.contract.errors import InvalidRequestError, is_int, is_number, normalize_token_ids, require
from accel.contract.structured_output import StructuredOutputSpec


def _normalize_stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = (stop,)
    if isinstance(stop, (list, tuple)):
        for s in stop:
            require(
                isinstance(s, str),
                "stop",
                f"expected a string or a list of strings, got an element of type {type(s).__name__}",
            )
        require(all(stop), "stop", "stop cannot contain an empty string.")  # vLLM's words
        return tuple(stop)
    raise InvalidRequestError("stop", f"expected a string or a list of strings, got {type(stop).__name__}")


def _normalize_logit_bias(bias: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI sends ``{"123": -100}``; we keep sorted ``(token_id, bias)`` pairs (hashable, frozen),
    each bias clamped to [-100, 100] as vLLM's ``SamplingParams.from_optional`` does (no 400)."""
    if bias is None:
        return ()
    if isinstance(bias, tuple):
        bias = dict(bias)
    require(isinstance(bias, Mapping), "logit_bias", "expected a mapping of token id to bias")
    pairs = []
    for key, value in bias.items():
        try:
            token_id = int(key)
        except (TypeError, ValueError):
            raise InvalidRequestError("logit_bias", f"key {key!r} is not a token id") from None
        require(token_id >= 0, "logit_bias", f"token id {token_id} is negative")
        require(is_number(value), "logit_bias", f"bias for token {token_id} must be a number, got {value!r}")
        pairs.append((token_id, min(100.0, max(-100.0, float(value)))))  # clamped, as vLLM's SamplingParams
    return tuple(sorted(pairs))


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling and stopping, spelled as vLLM's ``SamplingParams``.

    ``top_k`` 0 (or -1, normalized to 0) disables top-k; ``max_tokens`` None means "until
    max_model_len"; ``logprobs`` None means no logprobs, k >= 0 means the sampled token plus its
    top-k alternatives.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None
    # vLLM's prompt_logprobs: each prompt token's logprob plus its top-k (None: not asked for).
    # Engines that cannot compute them refuse the request naming the field (the TT engine).
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    skip_special_tokens: bool = True
    # Constrained decoding: a grammar (``StructuredOutputSpec``), an allow-list of token ids, and
    # vLLM's ``bad_words`` (the words as sent, for engines that tokenize them natively, and their
    # token sequences as vLLM's ``update_from_tokenizer`` builds them: the last token of a
    # sequence is banned when the output so far ends with the rest of it).
    structured_outputs: StructuredOutputSpec | None = None
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] = ()
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        require(
            is_number(self.temperature) and math.isfinite(self.temperature) and 0 <= self.temperature <= 2,
            "temperature",
            f"temperature must be in [0, 2], got {self.temperature!r}.",  # vLLM's range and words
        )
        require(is_number(self.top_p) and 0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p!r}")
        require(
            is_int(self.top_k) and self.top_k >= -1,
            "top_k",
            f"must be an integer >= -1 (-1 or 0 disables it), got {self.top_k!r}",
        )
        if self.top_k == -1:
            set_(self, "top_k", 0)
        require(is_number(self.min_p) and 0 <= self.min_p <= 1, "min_p", f"must be in [0, 1], got {self.min_p!r}")
        require(self.seed is None or is_int(self.seed), "seed", f"must be an integer, got {self.seed!r}")
        require(
            self.max_tokens is None or (is_int(self.max_tokens) and self.max_tokens >= 1),
            "max_tokens",
            f"must be an integer >= 1, got {self.max_tokens!r}",
        )
        require(
            is_int(self.min_tokens) and self.min_tokens >= 0,
            "min_tokens",
            f"must be an integer >= 0, got {self.min_tokens!r}",
        )
        require(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}",
        )
        set_(self, "stop", _normalize_stop(self.stop))
        set_(self, "stop_token_ids", normalize_token_ids(self.stop_token_ids, "stop_token_ids"))
        require(
            self.logprobs is None or (is_int(self.logprobs) and 0 <= self.logprobs <= 20),
            "logprobs",
            f"must be an integer in [0, 20], got {self.logprobs!r}",
        )
        require(
            self.prompt_logprobs is None or (is_int(self.prompt_logprobs) and 0 <= self.prompt_logprobs <= 20),
            "prompt_logprobs",
            f"must be an integer in [0, 20], got {self.prompt_logprobs!r}",
        )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            require(is_number(value) and -2 <= value <= 2, name, f"must be in [-2, 2], got {value!r}")
        require(
            is_number(self.repetition_penalty)
            and math.isfinite(self.repetition_penalty)
            and self.repetition_penalty > 0,
            "repetition_penalty",
            f"repetition_penalty must be greater than zero, got {self.repetition_penalty!r}.",  # vLLM's rule
        )
        set_(self, "logit_bias", _normalize_logit_bias(self.logit_bias))
        require(
            self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputSpec),
            "structured_outputs",
            "must be a StructuredOutputSpec",
        )
        if self.allowed_token_ids is not None:
            ids = normalize_token_ids(self.allowed_token_ids, "allowed_token_ids")
            require(len(ids) > 0, "allowed_token_ids", "allowed_token_ids is not None and empty!")  # vLLM's words
            set_(self, "allowed_token_ids", ids)
        require(
            isinstance(self.bad_words, (list, tuple)) and all(isinstance(w, str) and w for w in self.bad_words),
            "bad_words",
            "must be a list of non-empty strings",
        )
        set_(self, "bad_words", tuple(dict.fromkeys(self.bad_words)))
        require(isinstance(self.bad_words_token_ids, (list, tuple)), "bad_words", "expected token id sequences")
        seqs = tuple(normalize_token_ids(seq, "bad_words") for seq in self.bad_words_token_ids)
        require(all(seqs), "bad_words", "every bad word must tokenize to at least one token")
        set_(self, "bad_words_token_ids", seqs)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def has_logit_constraints(self) -> bool:
        """A grammar, an allow-list or bad words: logits are masked before sampling."""
        return (
            self.structured_outputs is not None or self.allowed_token_ids is not None or bool(self.bad_words_token_ids)
        )

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1
