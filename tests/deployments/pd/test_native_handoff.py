"""The native-connector PD hand-off (TPU: TPUConnector) with plain async functions standing in
for the engines and the Ray-free KV registry as the actor: the orchestrator's ticket becomes the
engine connector's own params on the way in and back, unchanged; missing or expired params make
the decode side recompute, counted."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from accel.contract import FinishReason, GenerateRequest, KVTransferParams, OutputDelta, SamplingParams, join_token_ids
from accel.kv_transfer.transport import KVTransferError, KVTransferNotFound
from deployments.kv.registry import KVRegistry
from deployments.pd.native_handoff import NIXL_PREFILL_PARAMS, NativeKVHandoff
from deployments.pd.orchestrator import PDOrchestrator

REQ = GenerateRequest("r1", (5, 6, 7, 8), SamplingParams(temperature=0, max_tokens=3))
TPU_PARAMS = {"uuid": 123456789, "remote_host": "10.0.0.7", "remote_port": 9100}


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


class RegistryStore:
    """``ParamsStore`` over the registry the actor wraps (what ``ActorParamsStore`` calls)."""

    def __init__(self, registry: KVRegistry):
        self.registry = registry

    async def put(self, transfer_id, params):
        try:
            self.registry.put_params(transfer_id, params)
            return True
        except KVTransferError:
            return False

    async def claim(self, transfer_id):
        try:
            return self.registry.claim_params(transfer_id)
        except KVTransferNotFound:
            return None

    async def report_recompute(self, reason):
        self.registry.report_recompute(reason)


class NativeEngine:
    """Behaves like vLLM with TPUConnector: a do_remote_decode prefill returns the connector's own
    params; a decode given them 'pulls' the KV (recorded); every request arrives as sent."""

    def __init__(self, returned=TPU_PARAMS):
        self.requests: list[GenerateRequest] = []
        self.returned = returned

    async def __call__(self, request):
        self.requests.append(request)
        kv = request.kv_transfer
        if kv is not None and kv.connector_params is not None and kv.connector_params.get("do_remote_decode"):
            returned = KVTransferParams(connector_params=self.returned) if self.returned else None
            yield OutputDelta(
                request.request_id, (9,), "", 4, 1, finish_reason=FinishReason.LENGTH, kv_transfer=returned
            )
            return
        yield OutputDelta(request.request_id, (1,), "", 4, 1)
        yield OutputDelta(request.request_id, (2, 3), "", 4, 3, finish_reason=FinishReason.LENGTH)


def replica_call(handoff: NativeKVHandoff, engine):
    """What ``VllmReplica.generate`` does around its engine on a native pool."""

    async def call(request):
        if request.kv_transfer is not None:
            request = await handoff.engine_request(request)
        async for delta in engine(request):
            if delta.finished and request.kv_transfer is not None:
                delta = await handoff.finished_delta(request, delta)
            yield delta

    return call


def _setup(lease_s=30.0, returned=TPU_PARAMS):
    clock = Clock()
    registry = KVRegistry(1 << 20, lease_s, clock)
    handoff = NativeKVHandoff(RegistryStore(registry))
    return registry, clock, handoff, NativeEngine(returned), NativeEngine()


def _stream(orch, prefill, decode):
    async def go():
        return [d async for d in orch.stream(REQ, prefill, decode)]

    return asyncio.run(go())


def test_connector_params_pass_from_prefill_to_decode_unchanged():
    registry, _, handoff, prefill_engine, decode_engine = _setup()
    orch = PDOrchestrator(metrics=False)
    out = _stream(orch, replica_call(handoff, prefill_engine), replica_call(handoff, decode_engine))
    assert join_token_ids(out) == [1, 2, 3] and orch.num_recomputes == {}
    pre = prefill_engine.requests[0]
    assert pre.kv_transfer.connector_params == NIXL_PREFILL_PARAMS  # no transfer id: the connector makes its own
    assert pre.sampling.max_tokens == 1
    dec = decode_engine.requests[0]
    assert dec.kv_transfer.connector_params == TPU_PARAMS  # what the prefill engine returned, as is
    assert dec.kv_transfer.transfer_id == pre.kv_transfer.transfer_id  # paired under our transfer id
    assert registry.stats().num_params == 0 and registry.stats().num_params_claimed == 1
    assert out[-1].kv_transfer is None  # the engine's params never leave the replica


def test_expired_params_make_decode_recompute():
    registry, clock, handoff, prefill_engine, decode_engine = _setup(lease_s=5.0)
    prefill = replica_call(handoff, prefill_engine)

    async def slow_prefill(request):  # the decode side comes after the params' lease ran out
        async for delta in prefill(request):
            yield delta
        clock.now += 5.0

    orch = PDOrchestrator(metrics=False)
    out = _stream(orch, slow_prefill, replica_call(handoff, decode_engine))
    assert join_token_ids(out) == [1, 2, 3], "the request must complete"
    assert decode_engine.requests[0].kv_transfer is None  # recomputes the prompt locally
    stats = registry.stats()
    assert stats.recomputes == {"params_missing": 1} and stats.num_expired == 1
    assert orch.num_recomputes == {}  # the prefill did return a ticket; the decode side counted


@pytest.mark.parametrize("returned", [None, {}])
def test_no_params_from_the_engine_means_no_ticket(returned):
    registry, _, handoff, prefill_engine, decode_engine = _setup(returned=returned)
    orch = PDOrchestrator(metrics=False)
    out = _stream(orch, replica_call(handoff, prefill_engine), replica_call(handoff, decode_engine))
    assert join_token_ids(out) == [1, 2, 3]
    assert orch.num_recomputes == {"no_ticket": 1} and decode_engine.requests[0].kv_transfer is None
    assert registry.stats().num_params == 0


def test_a_refused_put_means_no_ticket():
    registry, _, handoff, prefill_engine, _ = _setup()

    async def run():
        request = await handoff.engine_request(
            dataclasses.replace(REQ, kv_transfer=KVTransferParams(do_remote_decode=True, transfer_id="t1"))
        )
        registry.put_params("t1", {"taken": True})  # the id is already held
        delta = [d async for d in prefill_engine(request)][-1]
        return await handoff.finished_delta(request, delta)

    assert asyncio.run(run()).kv_transfer is None


def test_aborted_prefill_registers_nothing():
    registry, _, handoff, _, _ = _setup()

    async def run():
        request = await handoff.engine_request(
            dataclasses.replace(REQ, kv_transfer=KVTransferParams(do_remote_decode=True, transfer_id="t1"))
        )
        aborted = OutputDelta(
            "r1",
            (),
            "",
            4,
            0,
            finish_reason=FinishReason.ABORT,
            kv_transfer=KVTransferParams(connector_params=TPU_PARAMS),
        )
        return await handoff.finished_delta(request, aborted)

    assert asyncio.run(run()).kv_transfer is None and registry.stats().num_params == 0


def test_requests_without_hand_off_pass_through():
    _, _, handoff, _, _ = _setup()
    assert asyncio.run(handoff.engine_request(REQ)) is REQ
