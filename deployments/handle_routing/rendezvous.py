"""The request router on the router deployment's handles: which ROUTER replica decides a request.

With several router replicas, each keeps its own session bindings, tickets and in-flight counts
(the precise prefix index is the same on all: every one follows every engine's KV events). So
every request of one session must reach the same router replica, whichever ingress replica sends
it: the affinity key (``RouteRequest.affinity_key``: session id, else first prompt block hash,
else request id) picks the replica by rendezvous (highest-random-weight) hashing over the live
router replicas' ids. Every handle computes the same order from the same replica set (blake2b,
never Python's salted ``hash()``), and a replica leaving moves only the keys it owned; one
joining takes about 1/N of the keys.

A call with ``replica_hint=<router replica id>`` (``release`` of a ticket) goes to that replica:
only the issuer holds the ticket. Any other call (polls, broadcasts, tests) is spread by
rendezvous of its request id.

Ranks are single replicas in rendezvous order, so when the first choice cannot take the call
(full or gone) every handle falls back to the same second choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from deployments.handle_routing.pinned import replica_hint
from deployments.messages.routing import RouteRequest, stable_hash64


def rendezvous_weight(key: str, replica_id: str) -> int:
    """Stable 64-bit weight of (key, replica); the highest wins."""
    return stable_hash64(f"{key}\x00{replica_id}")


def rendezvous_order(key: str, replica_ids: Sequence[str]) -> list[str]:
    """``replica_ids`` best first for ``key`` (ties, practically impossible, by id)."""
    return sorted(replica_ids, key=lambda r: (-rendezvous_weight(key, r), r))


def affinity_key(pending_request: PendingRequest | None) -> str | None:
    """The key of a handle call: a ``RouteRequest`` argument's, else None."""
    if pending_request is None:
        return None
    for arg in pending_request.args or ():
        if isinstance(arg, RouteRequest):
            return arg.affinity_key
    return None


class RendezvousRequestRouter(FIFOMixin, RequestRouter):
    def initialize_state(self, **kwargs: Any) -> None:
        pass

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        hint = replica_hint(pending_request)
        if hint is not None and hint in by_id:
            return [[by_id[hint]]] + [[r] for i, r in by_id.items() if i != hint]
        key = affinity_key(pending_request)
        if key is None:
            metadata = getattr(pending_request, "metadata", None)
            key = "r:" + str(getattr(metadata, "request_id", "") or "")
        return [[by_id[i]] for i in rendezvous_order(key, list(by_id))]
