"""The engine handles' request router: the router deployment's choice first, the rest after."""

from __future__ import annotations

import asyncio

from deployments.handle_routing.pinned import PinnedReplicaRequestRouter, replica_hint
from tests.doubles.request_router_fakes import FakePending, fake_replicas


def _choose(replicas, pending):
    router = PinnedReplicaRequestRouter.__new__(PinnedReplicaRequestRouter)  # the ranking needs no router state
    return asyncio.run(router.choose_replicas(replicas, pending))


REPLICAS = fake_replicas("a", "b", "c")


def test_hint_ranks_first():
    ranks = _choose(REPLICAS, FakePending(kwargs={"replica_hint": "b"}))
    assert [[r.replica_id.unique_id for r in rank] for rank in ranks] == [["b"], ["a", "c"]]


def test_no_or_stale_hint_is_one_rank():
    for pending in (
        FakePending(),
        FakePending(kwargs={"replica_hint": "gone"}),
        None,
        FakePending(args=("odd", 3), kwargs={"replica_hint": 17}),
    ):
        ranks = _choose(REPLICAS, pending)
        assert [len(r) for r in ranks] == [3]


def test_hint_reader_tolerates_any_shape():
    assert replica_hint(None) is None
    assert replica_hint(FakePending(kwargs={"replica_hint": "x"})) == "x"
    assert replica_hint(FakePending(kwargs={})) is None
