"""Prefill/decode hand-off for pools whose engine's OWN KV connector moves the KV (TPU: only
``TPUConnector`` loads there), with the KV-connector actor as the control plane.

The orchestrator (``deployments.pd.orchestrator``) speaks one protocol to every pool: the prefill
request carries ``{do_remote_decode, transfer_id}``, the prefill's final delta returns a ticket
``{do_remote_prefill, transfer_id, num_tokens}``, the decode request carries that ticket. On a
native pool the replica (``VllmReplica``) translates, with ``NativeKVHandoff``:

1. prefill: the engine runs the request with vLLM's NIXL-convention params
   (``NIXL_PREFILL_PARAMS``: ``do_remote_decode`` and no transfer id, like upstream's proxy);
   the connector makes its own id and returns its ``kv_transfer_params`` (TPUConnector:
   ``{uuid, remote_host, remote_port}``; never read here). The replica registers that dict with
   the actor under our transfer id (``put_params``, leased like a KV transfer) and answers the
   orchestrator with the ticket. No dict returned, or the actor refuses -> no ticket, and the
   orchestrator has the decode side recompute.
2. decode: the replica claims the dict by transfer id (``claim_params``, which removes it) and
   hands it to the engine unchanged (``connector_params`` -> vLLM's
   ``SamplingParams.extra_args["kv_transfer_params"]``); the decode engine's connector pulls the
   KV from the prefill engine. Params missing (expired lease, unknown id, actor gone) -> the
   request runs without them, recomputing the prompt, and the actor counts the recompute.

``ParamsStore`` is injected: ``ActorParamsStore`` over the Ray actor (async calls, never blocking
the replica's event loop), or anything with the same three coroutines in tests.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from accel.contract import FinishReason, GenerateRequest, KVTransferParams, OutputDelta
from accel.kv_transfer.params import exported, new_transfer_id
from accel.kv_transfer.transport import KVTransferNotFound
from deployments.kv.connector_actor import get_or_create_kv_connector
from deployments.kv.connector_client import KVConnectorClient

logger = logging.getLogger(__name__)

# What upstream's disaggregation proxies send a prefill engine (vLLM's NIXL convention; the
# connector fills in where its KV can be pulled from).
NIXL_PREFILL_PARAMS: Mapping[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


class ParamsStore(Protocol):
    async def put(self, transfer_id: str, params: Mapping[str, Any]) -> bool:
        """Hold ``params`` under ``transfer_id`` (leased); False if it could not."""
        ...

    async def claim(self, transfer_id: str) -> Mapping[str, Any] | None:
        """The params, removed; None if unknown, expired or unreachable."""
        ...

    async def report_recompute(self, reason: str) -> None: ...


class NativeKVHandoff:
    def __init__(self, store: ParamsStore):
        self._store = store

    async def engine_request(self, request: GenerateRequest) -> GenerateRequest:
        """What the engine runs for ``request`` (see the module docstring)."""
        kv = request.kv_transfer
        if kv is None or kv.connector_params is not None:
            return request
        if kv.do_remote_decode:
            transfer_id = kv.transfer_id or new_transfer_id(request.request_id)
            return dataclasses.replace(
                request,
                kv_transfer=KVTransferParams(
                    do_remote_decode=True, transfer_id=transfer_id, connector_params=NIXL_PREFILL_PARAMS
                ),
            )
        if kv.do_remote_prefill:
            params = await self._store.claim(kv.transfer_id) if kv.transfer_id else None
            if params is None:
                logger.warning(
                    "KV params %s not held by the KV connector (expired or unknown): %s recomputes its prompt",
                    kv.transfer_id,
                    request.request_id,
                )
                await self._store.report_recompute("params_missing")
                return dataclasses.replace(request, kv_transfer=None)
            return dataclasses.replace(request, kv_transfer=dataclasses.replace(kv, connector_params=params))
        return dataclasses.replace(request, kv_transfer=None)

    async def finished_delta(self, engine_request: GenerateRequest, delta: OutputDelta) -> OutputDelta:
        """The final delta as the orchestrator expects it: a prefill's ticket (once the engine's
        params are registered), and never the engine's own params."""
        kv = engine_request.kv_transfer
        returned = delta.kv_transfer.connector_params if delta.kv_transfer is not None else None
        ticket = None
        # (engine_request always names the transfer of a do_remote_decode request)
        if kv is not None and kv.do_remote_decode and kv.transfer_id and delta.finish_reason is not FinishReason.ABORT:
            if not returned:
                logger.warning(
                    "prefill %s: the engine's KV connector returned no kv_transfer_params", engine_request.request_id
                )
            elif await self._store.put(kv.transfer_id, returned):
                ticket = exported(kv.transfer_id, delta.num_prompt_tokens)
        return dataclasses.replace(delta, kv_transfer=ticket)


class ActorParamsStore:
    """``ParamsStore`` over the application's KV-connector actor (created on first use)."""

    def __init__(self, app_name: str, timeout_s: float = 5.0):
        self.app_name = app_name
        self.timeout_s = timeout_s
        self._connector: KVConnectorClient | None = None

    async def put(self, transfer_id: str, params: Mapping[str, Any]) -> bool:
        try:
            await self._actor().put_params(transfer_id, params, self.timeout_s)
            return True
        except Exception:
            self._connector = None
            logger.warning("KV connector did not take the params of %s", transfer_id, exc_info=True)
            return False

    async def claim(self, transfer_id: str) -> Mapping[str, Any] | None:
        try:
            return await self._actor().claim_params(transfer_id, self.timeout_s)
        except Exception as exc:
            if not isinstance(exc, KVTransferNotFound):  # Ray re-raises the actor's error as a subclass
                self._connector = None
            logger.info("KV params %s not claimed: %s", transfer_id, exc)
            return None

    async def report_recompute(self, reason: str) -> None:
        try:
            self._actor().report_recompute(reason)
        except Exception:
            self._connector = None
            logger.warning("KV connector unreachable; recompute (%s) not counted", reason)

    def _actor(self) -> KVConnectorClient:
        if self._connector is None:
            self._connector = get_or_create_kv_connector(self.app_name)
        return self._connector
