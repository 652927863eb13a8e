"""The request router on every engine deployment's handle: send a request to the replica the
router deployment chose (the ``replica_hint`` keyword of ``generate``), else least-loaded.

Serve probes the replicas of the first rank and uses the least-loaded one with spare capacity,
moving to the next rank when the chosen replica is full, so a hint is a strong preference, not
a trap. Without a usable hint every candidate is in one rank: a local least-loaded choice.
"""

from __future__ import annotations

from typing import List, Optional

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

HINT_KWARG = "replica_hint"


def replica_hint(pending_request: Optional[PendingRequest]) -> str | None:
    if pending_request is None:
        return None
    hint = pending_request.kwargs.get(HINT_KWARG) if pending_request.kwargs else None
    return hint if isinstance(hint, str) else None


class PinnedReplicaRouter(FIFOMixin, RequestRouter):
    def initialize_state(self, **kwargs) -> None:
        pass

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None
                              ) -> List[List[RunningReplica]]:
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True
        hint = replica_hint(pending_request)
        if hint is not None:
            pinned = [r for r in candidate_replicas if r.replica_id.unique_id == hint]
            if pinned:
                rest = [r for r in candidate_replicas if r.replica_id.unique_id != hint]
                return [pinned, rest] if rest else [pinned]
        return [list(candidate_replicas)] if candidate_replicas else []
