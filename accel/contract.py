"""The engine contract: what every engine and deployment speaks.

A deployment hands an engine a ``GenerateRequest`` and reads back a stream of ``OutputDelta``s;
``EngineStats`` is the engine's load and cache snapshot. Both engine kinds (the TT mesh engine and
the vLLM slice engine) implement ``Engine``, so deployments treat them alike.

Every type here is a frozen dataclass validated on construction: an invalid value raises
``InvalidRequestError`` naming the offending field, which the HTTP edge turns into a 400.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


class InvalidRequestError(ValueError):
    """A request field holds a value no engine accepts. ``field`` names it (OpenAI's ``param``)."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message

    def __reduce__(self) -> tuple[type[InvalidRequestError], tuple[str, str]]:
        # Raised in an engine replica, it crosses a process boundary pickled; the default
        # reduce would call __init__ with the formatted message alone.
        return InvalidRequestError, (self.field, self.message)


class ConfigError(ValueError):
    """A configuration value is wrong. The message names the key (and the file, when known)."""


def _require(cond: bool, field_name: str, message: str) -> None:
    if not cond:
        raise InvalidRequestError(field_name, message)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _normalize_stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if isinstance(stop, (list, tuple)):
        for s in stop:
            _require(
                isinstance(s, str),
                "stop",
                f"expected a string or a list of strings, got an element of type {type(s).__name__}",
            )
        return tuple(s for s in stop if s)
    raise InvalidRequestError("stop", f"expected a string or a list of strings, got {type(stop).__name__}")


def _normalize_token_ids(values: Any, field_name: str) -> tuple[int, ...]:
    if values is None:
        return ()
    _require(isinstance(values, (list, tuple)), field_name, "expected a list of token ids")
    for v in values:
        _require(_is_int(v) and v >= 0, field_name, f"token ids must be non-negative integers, got {v!r}")
    return tuple(values)


def _normalize_logit_bias(bias: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI sends ``{"123": -100}``; we keep sorted ``(token_id, bias)`` pairs (hashable, frozen)."""
    if bias is None:
        return ()
    if isinstance(bias, tuple):
        bias = dict(bias)
    _require(isinstance(bias, Mapping), "logit_bias", "expected a mapping of token id to bias")
    pairs = []
    for key, value in bias.items():
        try:
            token_id = int(key)
        except (TypeError, ValueError):
            raise InvalidRequestError("logit_bias", f"key {key!r} is not a token id") from None
        _require(token_id >= 0, "logit_bias", f"token id {token_id} is negative")
        _require(
            _is_number(value) and -100 <= value <= 100,
            "logit_bias",
            f"bias for token {token_id} must be a number in [-100, 100], got {value!r}",
        )
        pairs.append((token_id, float(value)))
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
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        _require(
            _is_number(self.temperature) and self.temperature >= 0,
            "temperature",
            f"must be a number >= 0, got {self.temperature!r}",
        )
        _require(_is_number(self.top_p) and 0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p!r}")
        _require(
            _is_int(self.top_k) and self.top_k >= -1,
            "top_k",
            f"must be an integer >= -1 (-1 or 0 disables it), got {self.top_k!r}",
        )
        if self.top_k == -1:
            set_(self, "top_k", 0)
        _require(_is_number(self.min_p) and 0 <= self.min_p <= 1, "min_p", f"must be in [0, 1], got {self.min_p!r}")
        _require(self.seed is None or _is_int(self.seed), "seed", f"must be an integer, got {self.seed!r}")
        _require(
            self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
            "max_tokens",
            f"must be an integer >= 1, got {self.max_tokens!r}",
        )
        _require(
            _is_int(self.min_tokens) and self.min_tokens >= 0,
            "min_tokens",
            f"must be an integer >= 0, got {self.min_tokens!r}",
        )
        _require(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}",
        )
        set_(self, "stop", _normalize_stop(self.stop))
        set_(self, "stop_token_ids", _normalize_token_ids(self.stop_token_ids, "stop_token_ids"))
        _require(
            self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= 20),
            "logprobs",
            f"must be an integer in [0, 20], got {self.logprobs!r}",
        )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _require(_is_number(value) and -2 <= value <= 2, name, f"must be in [-2, 2], got {value!r}")
        _require(
            _is_number(self.repetition_penalty) and 0 < self.repetition_penalty <= 2,
            "repetition_penalty",
            f"must be in (0, 2], got {self.repetition_penalty!r}",
        )
        set_(self, "logit_bias", _normalize_logit_bias(self.logit_bias))

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1


@dataclass(frozen=True)
class KVTransferParams:
    """Prefill/decode disaggregation hand-off, named after vLLM's NIXL convention.

    A prefill request carries ``do_remote_decode=True`` (export the KV after prefill); the decode
    request carries ``do_remote_prefill=True`` and the ``transfer_id`` the prefill returned.

    ``connector_params``: the ``kv_transfer_params`` dict of an engine's OWN KV connector (e.g.
    tpu-inference's ``TPUConnector``: ``{uuid, remote_host, remote_port}``), handed to the engine
    and returned from it unchanged, never interpreted by meshserve; None = our own connector, which
    reads the fields above. JSON-like (vLLM returns it in HTTP bodies); copied on construction.
    """

    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    transfer_id: str | None = None
    num_tokens: int = 0
    connector_params: Mapping[str, Any] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        _require(
            not (self.do_remote_decode and self.do_remote_prefill),
            "kv_transfer_params",
            "a request cannot both export and import KV",
        )
        _require(
            not self.do_remote_prefill or bool(self.transfer_id),
            "kv_transfer_params",
            "do_remote_prefill needs a transfer_id",
        )
        if self.connector_params is not None:
            _require(
                isinstance(self.connector_params, Mapping) and all(isinstance(k, str) for k in self.connector_params),
                "kv_transfer_params",
                "connector params must be a mapping with string keys",
            )
            try:
                json.dumps(dict(self.connector_params))
            except (TypeError, ValueError) as exc:
                raise InvalidRequestError("kv_transfer_params", f"connector params are not JSON-like: {exc}") from None
            object.__setattr__(self, "connector_params", dict(self.connector_params))


@dataclass(frozen=True)
class GenerateRequest:
    """One generation. ``prompt_token_ids`` are already tokenized (chat template applied)."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    session_id: str | None = None
    kv_transfer: KVTransferParams | None = None

    def __post_init__(self) -> None:
        _require(isinstance(self.request_id, str) and bool(self.request_id), "request_id", "must be a non-empty string")
        ids = _normalize_token_ids(self.prompt_token_ids, "prompt")
        _require(len(ids) > 0, "prompt", "the prompt is empty")
        object.__setattr__(self, "prompt_token_ids", ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


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

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class EngineStats:
    """Load and cache snapshot. Prefix-cache counters are cumulative token counts (vLLM's units)."""

    num_waiting: int
    num_running: int
    num_kv_blocks_total: int
    num_kv_blocks_free: int
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    platform: str = ""

    @property
    def kv_usage(self) -> float:
        if self.num_kv_blocks_total == 0:
            return 0.0
        return 1.0 - self.num_kv_blocks_free / self.num_kv_blocks_total


@runtime_checkable
class Engine(Protocol):
    """What a replica wraps. ``generate`` yields deltas until one has ``finish_reason`` set;
    ``abort`` ends a request early (its last delta has ``FinishReason.ABORT``) and frees its KV."""

    def generate(self, request: GenerateRequest) -> AsyncIterator[OutputDelta]: ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    async def shutdown(self) -> None: ...


def join_token_ids(deltas: Iterable[OutputDelta]) -> list[int]:
    """All completion token ids of a finished stream, in order."""
    return [t for d in deltas for t in d.new_token_ids]
