"""The ingress hashes a prompt's blocks for the router, and only when the router places the
request: a request going straight to its pool's only replica is not hashed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from accel.block_hash import hash_prompt_blocks, salted_root
from accel.contract import FinishReason, GenerateRequest, OutputDelta
from deployments.messages.routing import RouteRequest
from serve_app.http.engine_client import BY_ROUTER, Placement
from tests.serve_app.http.scripted_stream import call, make_ingress

LONG = "The quick brown fox jumps over the lazy dog. " * 12


class OneReplica:
    """A pool client whose pool has one running replica (what Serve's handle reports)."""

    def running_replicas(self) -> frozenset[str]:
        return frozenset({"only"})


def _record_routes(ingress) -> list[tuple[GenerateRequest, RouteRequest, Placement]]:
    seen: list[tuple[GenerateRequest, RouteRequest, Placement]] = []

    async def stream(
        request: GenerateRequest, route: RouteRequest, placed=None, placement: Placement = BY_ROUTER
    ) -> AsyncGenerator[OutputDelta, None]:
        seen.append((request, route, placement))
        yield OutputDelta(
            request.request_id, (5,), "x", request.num_prompt_tokens, 1, finish_reason=FinishReason.LENGTH
        )

    ingress._client.stream = stream
    return seen


@pytest.mark.parametrize("salt", [None, "tenant-a"])
def test_a_request_the_router_places_carries_its_prompts_block_hashes(tiny_llama, salt):
    ingress = make_ingress(tiny_llama)
    seen = _record_routes(ingress)
    body: dict[str, Any] = {"model": "tiny-llama", "messages": [{"role": "user", "content": LONG}], "max_tokens": 1}
    if salt:
        body["cache_salt"] = salt
    status, _ = asyncio.run(call(ingress, body))
    assert status == 200
    [(request, route, placement)] = seen
    assert placement.by_router
    block_size = ingress._models["tiny-llama"].routing_block_size
    expected = tuple(hash_prompt_blocks(request.prompt_token_ids, block_size, salted_root(salt)))
    assert len(expected) == len(request.prompt_token_ids) // block_size > 1
    assert route.prompt_block_hashes == expected


def test_a_request_for_the_only_replica_is_not_hashed(tiny_llama):
    ingress = make_ingress(tiny_llama)
    ingress._client._engines["tt"] = OneReplica()
    seen = _record_routes(ingress)
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": LONG}], "max_tokens": 1, "n": 2}
    status, out = asyncio.run(call(ingress, body))
    assert status == 200 and len(out["choices"]) == 2
    assert [route.prompt_block_hashes for _, route, _ in seen] == [(), ()]
    # The decision it carries needs none: straight to that replica, no router round trip.
    assert [placement.direct.replica_id for _, _, placement in seen] == ["only", "only"]
