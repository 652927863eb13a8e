"""The boundary between ``TTMeshEngine``'s asyncio side and the ``EngineCore`` its step thread
runs, as typed messages (mini-sglang's ``message/`` style; dispatched by type, never by a string).

In (the inbox; the thread applies every posted message, in order, before its next step):
``AddRequest``, ``FinishRequest``, ``AbortRequest``.
Out (per request, to its consumer's asyncio queue): ``NewTokens`` after each step that gave the
request tokens (or the abort notice), ``RequestFailed`` when the request cannot go on.
``put_all`` delivers a batch of them on the consumer's event loop; ``take_pending`` merges what
a consumer finds queued into one ``NewTokens``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from accel.contract import GenerateRequest, KVTransferParams, TokenLogprob


@dataclass(frozen=True)
class AddRequest:
    """A new request for the engine (validated; its consumer's queue already exists).
    ``grammar``: its structured-output spec compiled (an ``xgrammar.CompiledGrammar``, compiled
    off the step loop), None without one. ``images``: its images processed on the host
    (``accel.tt.multimodal.ImageInput``), () for a text-only request."""

    request: GenerateRequest
    grammar: Any = None
    images: tuple[Any, ...] = ()
    verb: ClassVar[str] = "add"

    @property
    def req_id(self) -> str:
        return self.request.request_id


@dataclass(frozen=True)
class FinishRequest:
    """The consumer saw a stop the engine does not apply (a stop string): free the request, send
    no notice. A no-op when the engine already finished it."""

    req_id: str
    verb: ClassVar[str] = "finish"


@dataclass(frozen=True)
class AbortRequest:
    """``abort()``, or the consumer left early: free the request and send the abort notice (a
    ``NewTokens`` with ``is_aborted``). A no-op for an unknown or finished request."""

    req_id: str
    verb: ClassVar[str] = "abort"


InboxMessage = AddRequest | FinishRequest | AbortRequest


class NewTokens(NamedTuple):
    """What the engine thread hands a request's consumer after a step (one per request per step).
    (A NamedTuple rather than a frozen dataclass: one per running request per step, the hot path.)

    Detokenization and stop strings run on the consumer side (``OutputBuilder`` in
    ``TTMeshEngine.generate``), off the step loop; token-level stops (eos, stop ids, max_tokens,
    max_model_len) are also applied in the engine core, with the same function, so blocks free at
    once.
    """

    req_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None
    num_cached_tokens: int
    is_aborted: bool = False
    kv_transfer: KVTransferParams | None = None  # export ticket, on a request's last tokens


@dataclass(frozen=True)
class RequestFailed:
    """The request was dropped by the engine (a failed step or inbox message); its consumer
    raises ``error``. The request holds nothing any more."""

    req_id: str
    error: Exception


OutboxMessage = NewTokens | RequestFailed


def take_pending(first: OutboxMessage, queue: asyncio.Queue[OutboxMessage]) -> NewTokens:
    """``first`` and every message queued behind it (a slow consumer takes every pending step at
    once) as one ``NewTokens``: token ids concatenated, logprobs too when every item with tokens
    has them, the rest from the last. Raises the error of a ``RequestFailed`` among them."""
    if queue.empty() and type(first) is NewTokens:  # the common case: one step's tokens
        return first
    items = [first]
    while not queue.empty():
        items.append(queue.get_nowait())
    news: list[NewTokens] = []
    for item in items:
        if isinstance(item, RequestFailed):
            raise item.error
        news.append(item)
    token_ids = tuple(t for item in news for t in item.token_ids)
    logprobs = None
    if all(item.logprobs is not None for item in news if item.token_ids):
        logprobs = tuple(lp for item in news for lp in (item.logprobs or ()))
    return news[-1]._replace(token_ids=token_ids, logprobs=logprobs)


def put_all(batch: list[tuple[asyncio.Queue[OutboxMessage], OutboxMessage]]) -> None:
    """Queue each message on its consumer's queue (run on that queue's event loop)."""
    for queue, value in batch:
        queue.put_nowait(value)
