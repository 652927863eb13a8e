"""The router deployment's handle router: rendezvous choice of a router replica by the request's
affinity key (stable across processes, minimal movement on churn, spread), releases pinned to
the issuing replica."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from deployments.handle_routing.rendezvous import RendezvousRequestRouter, rendezvous_order
from deployments.messages.routing import RouteRequest
from tests.doubles.request_router_fakes import FakeMetadata, FakePending, fake_replicas


def _ranks(replicas, pending):
    router = RendezvousRequestRouter.__new__(RendezvousRequestRouter)  # the ranking needs no router state
    return [[r.replica_id.unique_id for r in rank] for rank in asyncio.run(router.choose_replicas(replicas, pending))]


def _route(rid, session=None, hashes=()):
    return RouteRequest(rid, "m", 10, session_id=session, prompt_block_hashes=hashes)


def test_affinity_key_prefers_session_then_prompt_head_then_request():
    assert _route("r", "chat", (5, 6)).affinity_key == "s:chat"
    assert _route("r", None, (5, 6)).affinity_key == "b:5"
    assert _route("r").affinity_key == "r:r"
    # Every turn of a conversation (and its retry) has the same key, whatever its request id.
    assert _route("turn-1", "chat", (1,)).affinity_key == _route("turn-2#retry", "chat", (9, 9)).affinity_key


def test_every_rank_is_one_replica_in_rendezvous_order_and_the_order_is_stable():
    replicas = fake_replicas("a", "b", "c")
    pending = FakePending(args=(_route("r1", "chat-7"),))
    ranks = _ranks(replicas, pending)
    assert sorted(sum(ranks, [])) == ["a", "b", "c"] and all(len(r) == 1 for r in ranks)
    assert ranks == [[i] for i in rendezvous_order("s:chat-7", ["a", "b", "c"])]
    assert _ranks(list(reversed(replicas)), pending) == ranks  # candidate order does not matter
    assert pending.routing_context.should_backoff


def test_same_choice_in_another_interpreter():
    # Process-independent: no salted hash() (PYTHONHASHSEED differs per process).
    keys = [f"s:chat-{i}" for i in range(20)]
    here = [rendezvous_order(k, ["r1", "r2", "r3"])[0] for k in keys]
    code = (
        "from deployments.handle_routing.rendezvous import rendezvous_order;"
        f"print([rendezvous_order(k, ['r1', 'r2', 'r3'])[0] for k in {keys!r}])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
        cwd=".",
    ).stdout
    assert out.strip() == repr(here)


def test_removing_a_replica_moves_only_its_keys_and_adding_one_takes_a_fair_share():
    keys = [f"s:{i}" for i in range(3000)]
    before = {k: rendezvous_order(k, ["a", "b", "c"])[0] for k in keys}
    counts = {r: sum(1 for v in before.values() if v == r) for r in "abc"}
    assert all(800 < n < 1200 for n in counts.values()), counts  # spread
    after = {k: rendezvous_order(k, ["a", "c"])[0] for k in keys}
    assert all(after[k] == before[k] for k in keys if before[k] != "b")  # only b's keys moved
    grown = {k: rendezvous_order(k, ["a", "b", "c", "d"])[0] for k in keys}
    moved = [k for k in keys if grown[k] != before[k]]
    assert all(grown[k] == "d" for k in moved) and 600 < len(moved) < 900  # about 1/4, all to d


def test_release_is_pinned_to_the_issuing_replica():
    replicas = fake_replicas("a", "b", "c")
    for issuer in ("a", "b", "c"):
        ranks = _ranks(replicas, FakePending(args=("ticket-1",), kwargs={"replica_hint": issuer}))
        assert ranks[0] == [issuer] and sorted(sum(ranks, [])) == ["a", "b", "c"]


def test_calls_without_a_route_are_spread_and_odd_shapes_are_tolerated():
    replicas = fake_replicas("a", "b", "c")
    firsts = {_ranks(replicas, FakePending(metadata=FakeMetadata(f"req-{i}")))[0][0] for i in range(30)}
    assert firsts == {"a", "b", "c"}
    for pending in (
        None,
        FakePending(args=(3, "x"), kwargs={"replica_hint": 17}),
        FakePending(kwargs={"replica_hint": "gone"}),
    ):
        assert sorted(sum(_ranks(replicas, pending), [])) == ["a", "b", "c"]
    assert _ranks([], FakePending()) == []
