"""Prefill/decode routing: the router plans PD for long prompts when prefill and decode pools
exist, and the ingress's engine client runs prefill -> decode with the ticket, releasing both."""

from __future__ import annotations

import asyncio

from accel.contract import (EngineStats, FinishReason, GenerateRequest, KVTransferParams, OutputDelta,
                            SamplingParams, join_token_ids)
from deployments.engine_client import EngineClient
from deployments.pd_plan import plan_pd
from deployments.route_types import PoolInfo, ReplicaLoad, ReplicaSnapshot, RouteRequest
from deployments.router_deployment import RouterDeployment
from tests.deployments.test_engine_client import FakePoolHandle, FakeRouterHandle, FakeStream
from tests.deployments.test_router_deployment import FakePoolHandle as FakePolledPool

POOLS = (PoolInfo("pre", "m", "tt", "cpu", "prefill"), PoolInfo("dec", "m", "vllm", "cpu", "decode"),
         PoolInfo("other", "m2", "tt", "cpu", "both"))


def _load(rid, pool, n):
    return ReplicaLoad(rid, pool, n)


def test_plan_pd_threshold_pools_and_pinning():
    loads = [_load("p1", "pre", 2), _load("p2", "pre", 0), _load("d1", "dec", 1)]
    assert plan_pd(RouteRequest("r", "m", 100), POOLS, loads, 100) == (("pre", "p2"), ("dec", "d1"))
    assert plan_pd(RouteRequest("r", "m", 99), POOLS, loads, 100) is None  # short: colocated
    assert plan_pd(RouteRequest("r", "m", 500, pool="dec"), POOLS, loads, 100) is None  # pinned
    assert plan_pd(RouteRequest("r", "m2", 500), POOLS, loads, 100) is None  # no PD pools
    assert plan_pd(RouteRequest("r", "m", 500), POOLS, [], 100) == (("pre", None), ("dec", None))
    assert plan_pd(RouteRequest("r", "m", 500), POOLS, loads, None) is None
    tpu_prefill = (PoolInfo("pre", "m", "vllm", "tpu", "prefill"), POOLS[1])
    assert plan_pd(RouteRequest("r", "m", 500), tpu_prefill, loads, 100) is None  # no KV path out of TPU


def test_router_deployment_decides_pd_and_counts_both_replicas():
    def snap(rid, pool):
        return ReplicaSnapshot(rid, pool, EngineStats(0, 0, 8, 8), 0)

    async def run():
        handles = {"pre": FakePolledPool([snap("p1", "pre")]), "dec": FakePolledPool([snap("d1", "dec")]),
                   "other": FakePolledPool([])}
        router = RouterDeployment(POOLS, handles, stats_period_s=60, pd_threshold_tokens=64)
        await router.refresh()
        long = await router.choose(RouteRequest("a", "m", 64))
        assert (long.prefill_pool, long.prefill_replica_id, long.pool, long.replica_id) == ("pre", "p1", "dec", "d1")
        assert long.reason == "prefill_decode" and long.prefill_ticket
        counts = {r.replica_id: r.num_routed_inflight for r in router.snapshot().replicas}
        assert counts == {"p1": 1, "d1": 1}
        router.release(long.prefill_ticket)  # prefill done: only the decode replica stays busy
        assert {r.replica_id: r.num_routed_inflight for r in router.snapshot().replicas} == {"p1": 0, "d1": 1}
        short = await router.choose(RouteRequest("b", "m", 10))
        assert short.prefill_pool is None and short.pool == "dec"  # the decode pool prefills short prompts
    asyncio.run(run())


def test_engine_client_runs_prefill_then_decode_with_the_ticket():
    from deployments.route_types import RouteDecision

    def prefill_stream(request):
        ticket = KVTransferParams(do_remote_prefill=True, transfer_id=request.kv_transfer.transfer_id, num_tokens=3)
        return FakeStream([OutputDelta(request.request_id, (9,), "", 3, 1, finish_reason=FinishReason.LENGTH,
                                       kv_transfer=ticket)])

    decoded = []

    def decode_stream(request):
        decoded.append(request)
        return FakeStream([OutputDelta(request.request_id, (1,), "", 3, 1),
                           OutputDelta(request.request_id, (2,), "", 3, 2, finish_reason=FinishReason.LENGTH)])

    decision = RouteDecision("dec", "d1", "t-dec", "prefill_decode", prefill_pool="pre", prefill_replica_id="p1",
                             prefill_ticket="t-pre")
    router = FakeRouterHandle(decision)
    pools = {"pre": FakePoolHandle(prefill_stream), "dec": FakePoolHandle(decode_stream)}
    client = EngineClient(POOLS, router, pools, decision_timeout_s=1, retry_after_s=1)
    request = GenerateRequest("r1", (5, 6, 7), SamplingParams(temperature=0, max_tokens=2))

    async def run():
        return [d async for d in client.stream(request, RouteRequest("r1", "m", 3))]

    out = asyncio.run(run())
    assert join_token_ids(out) == [1, 2]
    assert pools["pre"].calls == [("r1-prefill", "p1")] and pools["dec"].calls == [("r1", "d1")]
    assert decoded[0].kv_transfer.do_remote_prefill and decoded[0].kv_transfer.transfer_id.startswith("r1.")
    assert sorted(router.released) == ["t-dec", "t-pre"]
