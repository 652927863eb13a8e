"""The request router on every engine deployment's handle: send a request to the replica the
router deployment chose (the ``replica_hint`` keyword of ``generate``), else least-loaded. It also
publishes each running-replica set Serve pushes (``deployments.handle_routing.replica_membership``).

Serve probes the replicas of the first rank and uses the least-loaded one with spare capacity,
moving to the next rank when the chosen replica is full, so a hint is a strong preference, not
a trap. Without a usable hint every candidate is in one rank: a local least-loaded choice.
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

from deployments.handle_routing import replica_membership

HINT_KWARG = "replica_hint"


def replica_hint(pending_request: PendingRequest | None) -> str | None:
    if pending_request is None:
        return None
    hint = pending_request.kwargs.get(HINT_KWARG) if pending_request.kwargs else None
    return hint if isinstance(hint, str) else None


class PinnedReplicaRequestRouter(FIFOMixin, RequestRouter):
    def initialize_state(self, **kwargs: Any) -> None:
        pass

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """Serve pushed the running set: also tell in-process subscribers (the router deployment)."""
        super().update_replicas(replicas)
        self._publish_membership()

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._publish_membership()

    def _publish_membership(self) -> None:
        deployment = self._deployment_id
        replica_membership.publish(
            deployment.app_name, deployment.name, frozenset(r.unique_id for r in self.curr_replicas)
        )

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True
        hint = replica_hint(pending_request)
        if hint is not None:
            pinned = [r for r in candidate_replicas if r.replica_id.unique_id == hint]
            if pinned:
                rest = [r for r in candidate_replicas if r.replica_id.unique_id != hint]
                return [pinned, rest] if rest else [pinned]
        return [list(candidate_replicas)] if candidate_replicas else []
