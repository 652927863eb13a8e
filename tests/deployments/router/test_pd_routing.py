"""Prefill/decode routing: the router (RouterLogic) plans PD for long prompts when prefill and decode
pools exist, and the ingress's engine client runs prefill -> decode with the ticket, releasing both."""

from __future__ import annotations

import asyncio

from accel.contract import (
    EngineStats,
    FinishReason,
    GenerateRequest,
    KVTransferParams,
    OutputDelta,
    SamplingParams,
    join_token_ids,
)
from deployments.config.pd import PDConfig
from deployments.config.router import RouterConfig
from deployments.messages.replica_snapshot import ReplicaSnapshot
from deployments.messages.routing import RouteRequest
from deployments.router.deployment import RouterDeployment
from serve_app.http.engine_client import EngineClient
from tests.doubles.app_configs import app_config, pool_config
from tests.doubles.router_fakes import FakePoolHandle as FakePolledPool
from tests.serve_app.http.engine_doubles import FakePoolHandle, FakeRouterHandle, FakeStream

POOLS = (
    pool_config("pre", "m", "tt", "cpu", "prefill"),
    pool_config("dec", "m", "vllm", "cpu", "decode"),
    pool_config("other", "m2", "tt", "cpu", "both"),
)


def make_snap(rid, pool):
    return ReplicaSnapshot(rid, pool, EngineStats(0, 0, 8, 8), 0, 16)


async def _pd_router(pools, threshold=64):
    handles = {p.name: FakePolledPool([make_snap(f"{p.name}1", p.name)]) for p in pools}
    router = RouterDeployment(app_config(pools, RouterConfig(stats_period_s=60), PDConfig(threshold)), handles)
    await router.refresh()
    return router


async def in_flight_counts(router):
    return {v.replica_id: v.load.num_in_flight for v in (await router.snapshot()).replicas}


def test_router_deployment_decides_pd_and_counts_both_replicas():
    async def run():
        router = await _pd_router(POOLS)
        long = await router.choose(RouteRequest("a", "m", 64))
        assert (long.prefill_pool, long.prefill_replica_id, long.pool, long.replica_id) == (
            "pre",
            "pre1",
            "dec",
            "dec1",
        )
        assert long.reason == "prefill_decode" and long.prefill_ticket
        assert await in_flight_counts(router) == {"pre1": 1, "dec1": 1, "other1": 0}
        await router.release(long.prefill_ticket)  # prefill done: only the decode replica stays busy
        assert await in_flight_counts(router) == {"pre1": 0, "dec1": 1, "other1": 0}
        await router.release(long.ticket)
        short = await router.choose(RouteRequest("b", "m", 10))
        assert short.prefill_pool is None and short.pool == "dec"  # the decode pool prefills short prompts
        pinned = await router.choose(RouteRequest("c", "m", 500, pool="dec"))
        assert pinned.prefill_pool is None and pinned.replica_id == "dec1"  # a pin means no PD
        assert (await router.choose(RouteRequest("d", "m2", 500))).prefill_pool is None  # no PD pools

    asyncio.run(run())


def test_no_pd_through_tpu():
    async def run():
        # (A model without a PD threshold is a core case now: ModelRouting.pd_threshold_tokens None.)
        tpu_prefill = await _pd_router((pool_config("pre", "m", "vllm", "tpu", "prefill"), POOLS[1]))
        assert (await tpu_prefill.choose(RouteRequest("a", "m", 500))).prefill_pool is None  # no KV path out of TPU
        tpu_decode = await _pd_router((POOLS[0], pool_config("dec", "m", "vllm", "tpu", "decode")))
        assert (await tpu_decode.choose(RouteRequest("a", "m", 500))).prefill_pool is None  # nor into TPU
        tpu_to_tt = await _pd_router((pool_config("pre", "m", "vllm", "tpu", "prefill", 16, "TPUConnector"), POOLS[1]))
        assert (await tpu_to_tt.choose(RouteRequest("a", "m", 500))).prefill_pool is None  # TPUConnector ends at TPU

    asyncio.run(run())


def test_tpu_to_tpu_pd_through_their_own_connector():
    async def run():
        pools = (
            pool_config("pre", "m", "vllm", "tpu", "prefill", 16, "TPUConnector"),
            pool_config("dec", "m", "vllm", "tpu", "decode", 16, "TPUConnector"),
        )
        router = await _pd_router(pools)
        long = await router.choose(RouteRequest("a", "m", 500))
        assert (long.prefill_pool, long.pool, long.reason) == ("pre", "dec", "prefill_decode")
        assert (await router.choose(RouteRequest("b", "m", 10))).prefill_pool is None
        # a TT decode pool next to them: one model's PD pools must share one path, so no PD at all
        mixed = await _pd_router(pools + (pool_config("tt", "m", "tt", "tt", "decode"),))
        assert (await mixed.choose(RouteRequest("c", "m", 500))).prefill_pool is None

    asyncio.run(run())


def test_engine_client_runs_prefill_then_decode_with_the_ticket():
    from deployments.messages.routing import RouteDecision

    def prefill_stream(request):
        ticket = KVTransferParams(do_remote_prefill=True, transfer_id=request.kv_transfer.transfer_id, num_tokens=3)
        return FakeStream(
            [OutputDelta(request.request_id, (9,), "", 3, 1, finish_reason=FinishReason.LENGTH, kv_transfer=ticket)]
        )

    decoded = []

    def decode_stream(request):
        decoded.append(request)
        return FakeStream(
            [
                OutputDelta(request.request_id, (1,), "", 3, 1),
                OutputDelta(request.request_id, (2,), "", 3, 2, finish_reason=FinishReason.LENGTH),
            ]
        )

    decision = RouteDecision(
        "dec", "d1", "t-dec", "prefill_decode", prefill_pool="pre", prefill_replica_id="p1", prefill_ticket="t-pre"
    )
    router = FakeRouterHandle(decision)
    pools = {"pre": FakePoolHandle(prefill_stream), "dec": FakePoolHandle(decode_stream)}
    client = EngineClient(app_config(POOLS, RouterConfig(decision_timeout_s=1)), router, pools)
    request = GenerateRequest("r1", (5, 6, 7), SamplingParams(temperature=0, max_tokens=2))

    async def run():
        return [d async for d in client.stream(request, RouteRequest("r1", "m", 3))]

    out = asyncio.run(run())
    assert join_token_ids(out) == [1, 2]
    assert pools["pre"].calls == [("r1-prefill", "p1")] and pools["dec"].calls == [("r1", "d1")]
    assert decoded[0].kv_transfer.do_remote_prefill and decoded[0].kv_transfer.transfer_id.startswith("r1.")
    assert sorted(router.released) == ["t-dec", "t-pre"]
