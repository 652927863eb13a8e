"""Prefill/decode disaggregation of one request: the ONE place that orchestrates it.

``PDOrchestrator.stream`` runs prefill -> transfer -> decode import -> stream:
1. the prefill replica gets a copy of the request clamped to one token (``max_tokens=1``, no
   ``min_tokens``, stops, logprobs or logit constraints such as a structured-output grammar)
   carrying ``kv_transfer={do_remote_decode, transfer_id}``; its engine exports the prompt's KV to
   the KV-connector actor and returns the ticket on its final delta (the prefill's sampled token
   is discarded: decode samples it again from the same KV);
2. the decode replica gets the original request with that ticket (``do_remote_prefill``); its
   engine imports the KV (tokens marked computed) and decodes; its deltas stream to the caller.
On pools whose engine's own connector moves the KV (TPU: ``TPUConnector``) the replicas translate
this protocol to the connector's ``kv_transfer_params`` and back (``deployments.pd.native_handoff``);
the orchestrator sees the same tickets either way.
Any failure before decode — prefill error or timeout, no ticket (export failed, actor full or
gone) — sends the original request to the decode replica without a ticket: it recomputes the
prompt locally, so no request is lost; the decode engines recompute on their own when the ticket
names a transfer that expired or cannot be read. Each recompute decided here is counted
(``meshserve_pd_recomputes{reason}``); the engines count theirs in the actor's counter.

The replica calls are injected (``Call``: request -> async iterator of deltas), so this module
knows nothing of Serve handles or engines and is tested with plain async functions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from ray.util.metrics import Counter

from accel.contract import GenerateRequest, KVTransferParams, OutputDelta
from accel.kv_transfer.params import new_transfer_id

logger = logging.getLogger(__name__)

Call = Callable[[GenerateRequest], AsyncIterator[OutputDelta]]
PREFILL_REQUEST_ID_SUFFIX = "-prefill"


def prefill_request(request: GenerateRequest, transfer_id: str) -> GenerateRequest:
    """The prefill-only copy: one token, nothing that could stop it early or cost extra work."""
    sampling = dataclasses.replace(
        request.sampling,
        max_tokens=1,
        min_tokens=0,
        stop=(),
        stop_token_ids=(),
        logprobs=None,
        include_stop_str_in_output=False,
        # no grammar (nor allow-list / bad words): the prefill's token is discarded, and a
        # constrained row would push the prefill batch onto the host sampling path
        structured_outputs=None,
        allowed_token_ids=None,
        bad_words=(),
        bad_words_token_ids=(),
    )
    return dataclasses.replace(
        request,
        request_id=request.request_id + PREFILL_REQUEST_ID_SUFFIX,
        sampling=sampling,
        kv_transfer=KVTransferParams(do_remote_decode=True, transfer_id=transfer_id),
    )


class PDOrchestrator:
    def __init__(self, prefill_timeout_s: float = 60.0, metrics: Any = None):
        self.prefill_timeout_s = prefill_timeout_s
        # metrics: a Counter-like object; None = a ray.util.metrics Counter when in Ray; False = off
        self._metrics = (metrics or None) if metrics is not None else _make_metrics()
        self.num_recomputes: dict[str, int] = {}

    async def stream(self, request: GenerateRequest, prefill: Call, decode: Call) -> AsyncGenerator[OutputDelta, None]:
        ticket = await self._prefill(request, prefill)
        decode_request = dataclasses.replace(request, kv_transfer=ticket)
        async for delta in decode(decode_request):
            yield delta

    async def _prefill(self, request: GenerateRequest, prefill: Call) -> KVTransferParams | None:
        pre = prefill_request(request, new_transfer_id(request.request_id))
        try:
            last = await asyncio.wait_for(_last(prefill(pre)), self.prefill_timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            reason = "prefill_timeout" if isinstance(exc, asyncio.TimeoutError) else "prefill_failed"
            logger.warning("PD prefill of %s failed (%r); decode recomputes the prompt", request.request_id, exc)
            self._recompute(reason)
            return None
        ticket = None if last is None else last.kv_transfer
        if ticket is None or not ticket.do_remote_prefill or not ticket.transfer_id:
            logger.warning("PD prefill of %s returned no KV ticket; decode recomputes the prompt", request.request_id)
            self._recompute("no_ticket")
            return None
        return ticket

    def _recompute(self, reason: str) -> None:
        self.num_recomputes[reason] = self.num_recomputes.get(reason, 0) + 1
        if self._metrics is not None:
            self._metrics.inc(1, tags={"reason": reason})


async def _last(stream: AsyncIterator[OutputDelta]) -> OutputDelta | None:
    last = None
    async for delta in stream:
        last = delta
    return last


def _make_metrics() -> Counter | None:
    try:
        return Counter(
            "meshserve_pd_recomputes",
            "Disaggregated requests whose decode side recomputed the prompt because the prefill/transfer failed",
            tag_keys=("reason",),
        )
    except Exception:  # outside a Ray worker
        return None
