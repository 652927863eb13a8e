"""The ingress's engine client when an engine replica dies: reported to the routers, retried
elsewhere before any output, failed over mid-stream (prompt + tokens sent) after it, under PD too."""

from __future__ import annotations

import asyncio

import pytest

from accel.contract import FinishReason, GenerateRequest, OutputDelta
from deployments.config.ingress import IngressConfig
from deployments.config.router import RouterConfig
from deployments.messages.routing import RouteDecision, RouteRequest
from serve_app.http.engine_client import EngineClient
from serve_app.http.protocol.errors import APIError
from tests.doubles.app_configs import app_config, pool_config
from tests.serve_app.http.engine_doubles import (
    POOLS,
    REQ,
    FakePoolHandle,
    FakeRouterHandle,
    FakeStream,
    dead_actor_error,
    delta,
    make_client,
)


def test_dead_replica_before_any_output_is_reported_and_retried_elsewhere():
    async def run():
        router = FakeRouterHandle(
            [
                RouteDecision("tt", "t1", "r", "prefix", router_replica_id="R1"),
                RouteDecision("tt", "t2", "r#retry", "load", router_replica_id="R1"),
            ]
        )
        calls = []

        def make(request):
            calls.append(request.request_id)
            if len(calls) == 1:
                return FakeStream([], dead_actor_error())
            return FakeStream([delta(request.request_id, 1), delta(request.request_id, 2, True)])

        client, pools = make_client(router, pools={"tt": FakePoolHandle(make)})
        route = RouteRequest("r", "m", 2, session_id="chat")
        deltas = [d async for d in client.stream(REQ, route)]
        await asyncio.sleep(0.01)
        assert [d.new_token_ids for d in deltas] == [(1,), (2,)] and deltas[-1].finished
        assert pools["tt"].calls == [("r", "t1"), ("r", "t2")]  # the same engine request, elsewhere
        retry = router.routes[1]
        assert retry.excluded_replicas == ("t1",) and retry.request_id == "r#retry"
        assert retry.affinity_key == route.affinity_key  # decided by the same router replica
        assert router.dead_reports == [("t1", "ab" * 16)]
        assert router.released == ["r", "r#retry"]

    asyncio.run(run())


def test_dead_replica_after_output_began_fails_over_once_then_503():
    async def run():
        router = FakeRouterHandle(RouteDecision("tt", "t1", "r", "prefix", router_replica_id="R1"))
        pools = {"tt": FakePoolHandle(lambda r: FakeStream([delta(r.request_id, 1)], dead_actor_error()))}
        client, _ = make_client(router, pools=pools)
        got = []
        with pytest.raises(APIError) as err:
            async for d in client.stream(REQ, RouteRequest("r", "m", 2)):
                got.append(d)
        await asyncio.sleep(0.01)
        # One failover (ingress.max_failovers = 1); its replica dies too: 503.
        assert len(got) == 2 and err.value.status == 503 and err.value.headers() == {"Retry-After": "2"}
        assert router.dead_reports == [("t1", "ab" * 16)] * 2 and len(router.routes) == 2
        assert router.routes[1].request_id == "r#failover1" and router.routes[1].excluded_replicas == ("t1",)
        assert router.released == ["r", "r"]

    asyncio.run(run())


def test_mid_stream_failover_continues_from_the_tokens_sent():
    """The continuation gets prompt + tokens sent and the rest of the budget; its deltas reach the
    consumer in the original request's terms (id, prompt length, cumulative completion count)."""
    from accel.contract import SamplingParams

    request = GenerateRequest("r", (1, 2, 3), SamplingParams(max_tokens=5, min_tokens=3, temperature=0))

    async def run():
        router = FakeRouterHandle([RouteDecision("tt", "t1", "a", "prefix"), RouteDecision("tt", "t2", "b", "load")])
        seen = []

        def make(req):
            seen.append(req)
            if len(seen) == 1:  # two tokens, then the replica dies
                return FakeStream(
                    [OutputDelta("r", (7,), "x", 3, 1, 2), OutputDelta("r", (8,), "y", 3, 2, 2)], dead_actor_error()
                )
            rid = req.request_id
            return FakeStream(
                [
                    OutputDelta(rid, (9,), "z", 5, 1, 5),
                    OutputDelta(rid, (4, 6), "w", 5, 3, 5, finish_reason=FinishReason.LENGTH),
                ]
            )

        client, pools = make_client(router, pools={"tt": FakePoolHandle(make)})
        deltas = [d async for d in client.stream(request, RouteRequest("r", "m", 3))]
        cont = seen[1]
        assert cont.request_id == "r#failover1" and cont.prompt_token_ids == (1, 2, 3, 7, 8)
        assert cont.sampling.max_tokens == 3 and cont.sampling.min_tokens == 1
        assert pools["tt"].calls == [("r", "t1"), ("r#failover1", "t2")]
        assert [t for d in deltas for t in d.new_token_ids] == [7, 8, 9, 4, 6]
        assert {d.request_id for d in deltas} == {"r"} and {d.num_prompt_tokens for d in deltas} == {3}
        assert [d.num_completion_tokens for d in deltas] == [1, 2, 3, 5]
        assert {d.num_cached_tokens for d in deltas} == {2} and deltas[-1].finish_reason == FinishReason.LENGTH
        assert router.routes[1].num_prompt_tokens == 5 and router.routes[1].excluded_replicas == ("t1",)

    asyncio.run(run())


def test_no_failover_when_disabled():
    async def run():
        router = FakeRouterHandle(RouteDecision("tt", "t1", "r", "prefix"))
        pools = {"tt": FakePoolHandle(lambda r: FakeStream([delta(r.request_id, 1)], dead_actor_error()))}
        config = app_config(POOLS, RouterConfig(decision_timeout_s=0.05), ingress=IngressConfig(max_failovers=0))
        client = EngineClient(config, router, pools)
        with pytest.raises(APIError) as err:
            [d async for d in client.stream(REQ, RouteRequest("r", "m", 2))]
        assert err.value.status == 503 and len(router.routes) == 1

    asyncio.run(run())


def test_a_dependency_dying_inside_a_live_replica_is_not_a_replica_death():
    from ray.exceptions import ActorDiedError, RayTaskError

    async def run():
        router = FakeRouterHandle(RouteDecision("tt", "t1", "r", "prefix"))
        wrapped = RayTaskError("generate", "traceback", ActorDiedError())
        client, _ = make_client(router, pools={"tt": FakePoolHandle(lambda r: FakeStream([], wrapped))})
        with pytest.raises(APIError) as err:
            [d async for d in client.stream(REQ, RouteRequest("r", "m", 2))]
        await asyncio.sleep(0.01)
        assert err.value.status == 500 and router.dead_reports == [] and len(router.routes) == 1

    asyncio.run(run())


def test_pd_decode_death_mid_stream_continues_on_another_decode_replica():
    from accel.contract import KVTransferParams, SamplingParams

    pd_pools = (pool_config("pre", "m", "vllm", "cpu", "prefill"), pool_config("dec", "m", "vllm", "cpu", "decode"))
    request = GenerateRequest("r", (1, 2, 3), SamplingParams(max_tokens=4, temperature=0))

    async def run():
        router = FakeRouterHandle(
            [
                RouteDecision("dec", "d1", "a", "prefill_decode", prefill_pool="pre", prefill_replica_id="p1"),
                RouteDecision("dec", "d2", "b", "load"),
            ]
        )
        decode_calls = []
        ticket = KVTransferParams(do_remote_prefill=True, transfer_id="x")

        def prefill(req):
            return FakeStream(
                [OutputDelta(req.request_id, (5,), "", 3, 1, kv_transfer=ticket, finish_reason=FinishReason.LENGTH)]
            )

        def decode(req):
            decode_calls.append(req)
            if len(decode_calls) == 1:  # the decode replica dies after two tokens
                return FakeStream(
                    [OutputDelta("r", (7,), "", 3, 1), OutputDelta("r", (8,), "", 3, 2)], dead_actor_error()
                )
            return FakeStream([OutputDelta(req.request_id, (9, 4), "", 5, 2, finish_reason=FinishReason.LENGTH)])

        pools = {"pre": FakePoolHandle(prefill), "dec": FakePoolHandle(decode)}
        client = EngineClient(app_config(pd_pools, RouterConfig(decision_timeout_s=0.05)), router, pools)
        deltas = [d async for d in client.stream(request, RouteRequest("r", "m", 3))]
        assert [t for d in deltas for t in d.new_token_ids] == [7, 8, 9, 4] and deltas[-1].finished
        assert decode_calls[0].kv_transfer == ticket  # the first decode imported the prefill's KV
        assert decode_calls[1].prompt_token_ids == (1, 2, 3, 7, 8) and decode_calls[1].kv_transfer is None
        assert router.routes[1].excluded_replicas == ("d1",)
        assert deltas[-1].num_prompt_tokens == 3 and deltas[-1].num_completion_tokens == 4

    asyncio.run(run())


def test_a_salted_continuation_is_routed_by_its_salted_block_hashes():
    """The continuation's prefix hashes chain from the request's ``cache_salt`` root, as the
    ingress hashes the first attempt's prompt (salted prompts share no hash with others)."""
    from accel.block_hash import hash_prompt_blocks, salted_root
    from accel.contract import SamplingParams

    block_size = app_config(POOLS).models[0].routing_block_size
    prompt = tuple(range(1, 2 * block_size))  # one token short of two blocks: the continuation fills it
    request = GenerateRequest("r", prompt, SamplingParams(max_tokens=4, temperature=0), cache_salt="tenant-a")

    root = salted_root("tenant-a")
    first = RouteRequest("r", "m", len(prompt), prompt_block_hashes=tuple(hash_prompt_blocks(prompt, block_size, root)))
    seen, routes = _fail_over_once(request, first)
    continued = seen[1].prompt_token_ids
    assert len(continued) == 2 * block_size
    hashes = routes[1].prompt_block_hashes
    assert hashes == tuple(hash_prompt_blocks(continued, block_size, root)) and len(hashes) == 2
    assert hashes != tuple(hash_prompt_blocks(continued, block_size))


def test_a_continuation_with_images_keeps_its_image_keyed_hashes():
    """A token-only rehash would drop the images from the continuation's hashes (two images'
    continuations would then share blocks in the router's index): it keeps the first route's."""
    from accel.contract import EncodedImage, SamplingParams

    prompt = tuple(range(1, 40))
    image = EncodedImage(b"png-bytes", "image/png")
    request = GenerateRequest("r", prompt, SamplingParams(max_tokens=4, temperature=0), images=(image,))

    seen, routes = _fail_over_once(request, RouteRequest("r", "m", len(prompt), prompt_block_hashes=(11, 22)))
    assert seen[1].images == (image,) and routes[1].prompt_block_hashes == (11, 22)


class _FailoverCounts:
    """The ingress metrics' failover counter, by model (``IngressMetrics.failover``)."""

    def __init__(self) -> None:
        self.failovers: list[str] = []

    def failover(self, model: str) -> None:
        self.failovers.append(model)

    def fallback(self, reason: str) -> None:
        raise AssertionError(f"unexpected router fallback: {reason}")


def test_each_failover_is_counted_for_its_model():
    async def run():
        router = FakeRouterHandle([RouteDecision("tt", "t1", "a", "prefix"), RouteDecision("tt", "t2", "b", "load")])
        attempts = []

        def make(req):
            attempts.append(req.request_id)
            if len(attempts) == 1:
                return FakeStream([delta(req.request_id, 1)], dead_actor_error())
            return FakeStream([delta(req.request_id, 2, True)])

        metrics = _FailoverCounts()
        client, _ = make_client(router, pools={"tt": FakePoolHandle(make)}, metrics=metrics)
        deltas = [d async for d in client.stream(REQ, RouteRequest("r", "m", 2))]
        assert deltas[-1].finished and attempts == ["r", "r#failover1"]
        assert metrics.failovers == ["m"]  # one failover, under the request's model

    asyncio.run(run())


def _fail_over_once(request: GenerateRequest, first: RouteRequest) -> tuple[list, list]:
    """Stream ``request``: its first replica dies after one token, the second finishes it. The
    engine requests the pools saw and the routes the router was asked for."""
    prompt = request.prompt_token_ids

    async def run():
        router = FakeRouterHandle([RouteDecision("tt", "t1", "a", "prefix"), RouteDecision("tt", "t2", "b", "load")])
        seen = []

        def make(req):
            seen.append(req)
            if len(seen) == 1:
                return FakeStream([OutputDelta("r", (7,), "x", len(prompt), 1)], dead_actor_error())
            return FakeStream(
                [OutputDelta(req.request_id, (9,), "z", len(prompt) + 1, 1, finish_reason=FinishReason.LENGTH)]
            )

        client, _ = make_client(router, pools={"tt": FakePoolHandle(make)})
        [d async for d in client.stream(request, first)]
        return seen, router.routes

    return asyncio.run(run())
