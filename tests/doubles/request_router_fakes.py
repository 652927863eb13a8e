"""Stand-ins for what Serve hands a ``RequestRouter.choose_replicas``: running replicas (only their
``replica_id.unique_id`` is read) and a pending request (args, kwargs, routing context, metadata)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FakeReplicaID:
    unique_id: str


@dataclass
class FakeReplica:
    replica_id: FakeReplicaID


@dataclass
class FakeRoutingContext:
    should_backoff: bool = False


@dataclass
class FakeMetadata:
    request_id: str = ""


@dataclass
class FakePending:
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    routing_context: FakeRoutingContext = field(default_factory=FakeRoutingContext)
    metadata: FakeMetadata = field(default_factory=FakeMetadata)


def fake_replicas(*ids: str) -> list[FakeReplica]:
    return [FakeReplica(FakeReplicaID(i)) for i in ids]
