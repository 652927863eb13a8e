"""Ray Serve 2.60's own ``PrefixCacheAffinityRouter`` as a simulator peer (not a re-implementation).

The router class and its ``PrefixTreeActor`` are imported from the installed ray
(``ray.llm._internal.serve.routing_policies.prefix_aware``; importing them needs no engine
package). The router is constructed and driven as Ray's own unit tests drive it:
``deployment_id``, ``handle_source=REPLICA``, ``use_replica_queue_len_cache=False`` (so every
decision probes the replicas' queue lengths, i.e. fresh load), the simulated clock as
``get_curr_time_s``, ``initialize_state(imbalanced_threshold=..., tree_actor=<a real
PrefixTreeActor>)``, ``update_replicas`` with running-replica fakes, then
``await _choose_replica_for_request(PendingRequest)`` per request and ``on_request_routed``
after it — the full Serve routing path (``choose_replicas`` -> prefix match or power of two ->
least queue among the ranked group). The tree actor is a real Ray actor, so the simulator needs
a local Ray (``ensure_ray``: one CPU, small object store); each decision makes the router's
blocking ``ray.get`` calls on it, as it does in Serve.

Fakes are written from Ray's real signatures: ``SimReplica`` subclasses
``ray.serve._private.request_router.RunningReplica`` (as Ray's test fake does) and answers
``get_queue_len`` with the simulated replica's requests in flight (what a Serve replica reports:
its ongoing requests); the request argument is an object with a ``prompt`` attribute (Ray reads
``.prompt`` or ``.messages`` of the first argument that has one).
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections.abc import Sequence
from typing import Any

# Serve's ongoing-request cap per replica: large, so the engine's own queue (modelled by the
# cluster simulator) holds the backlog instead of Serve's backoff loop.
MAX_ONGOING_REQUESTS = 1_000_000


def ensure_ray() -> None:
    import ray

    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(
            address="local",
            num_cpus=1,
            object_store_memory=80 * 1024 * 1024,
            include_dashboard=False,
            log_to_driver=False,
        )


def _replica_class() -> type:
    from ray.serve._private.common import DeploymentID, ReplicaID
    from ray.serve._private.request_router import RunningReplica

    class SimReplica(RunningReplica):
        """A running replica whose queue length is the simulator's in-flight count."""

        def __init__(self, unique_id: str, deployment_id: DeploymentID, in_flight: dict[str, int]) -> None:
            # RunningReplica.__init__ wants a RunningReplicaInfo with an actor handle; like Ray's
            # own FakeRunningReplica we set only what the router reads.
            self._replica_id = ReplicaID(unique_id=unique_id, deployment_id=deployment_id)
            self._in_flight = in_flight

        @property
        def replica_id(self) -> ReplicaID:
            return self._replica_id

        @property
        def actor_id(self) -> Any:
            return None

        @property
        def node_id(self) -> str:
            return ""

        @property
        def availability_zone(self) -> str | None:
            return None

        @property
        def multiplexed_model_ids(self) -> set[str]:
            return set()

        @property
        def routing_stats(self) -> dict[str, Any]:
            return {}

        @property
        def max_ongoing_requests(self) -> int:
            return MAX_ONGOING_REQUESTS

        @property
        def is_cross_language(self) -> bool:
            return False

        def push_proxy_handle(self, handle: Any) -> None:
            pass

        async def get_queue_len(self, *, deadline_s: float) -> int:
            return self._in_flight[self._replica_id.unique_id]

    return SimReplica


class _Prompt:
    """The handle call's argument as Ray's router reads it (``.prompt``)."""

    def __init__(self, prompt: str) -> None:
        self.prompt = prompt


class RaySimRouter:
    """Ray's PrefixCacheAffinityRouter with the simulator's replicas behind it."""

    def __init__(self, replica_ids: Sequence[str], imbalanced_threshold: float, seed: int) -> None:
        ensure_ray()
        from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
            PrefixCacheAffinityRouter,
        )
        from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import PrefixTreeActor
        from ray.serve._private.common import DeploymentHandleSource, DeploymentID

        random.seed(seed)  # power-of-two sampling uses the module-level random
        self.now_s = 0.0
        self.in_flight = {r: 0 for r in replica_ids}
        self._replica_of: dict[str, Any] = {}
        self._loop = asyncio.new_event_loop()
        deployment_id = DeploymentID(name="sim", app_name="sim")
        self._tree_actor = PrefixTreeActor.remote()
        self.router = PrefixCacheAffinityRouter(
            deployment_id=deployment_id,
            handle_source=DeploymentHandleSource.REPLICA,
            use_replica_queue_len_cache=False,
            get_curr_time_s=lambda: self.now_s,
        )
        self.router.initialize_state(imbalanced_threshold=imbalanced_threshold, tree_actor=self._tree_actor)
        replica_cls = _replica_class()
        replicas = [replica_cls(r, deployment_id, self.in_flight) for r in replica_ids]
        self._tenant = {r.replica_id.unique_id: r.replica_id.to_full_id_str() for r in replicas}

        async def _update() -> None:  # update_replicas needs the running loop (probe task)
            self.router.update_replicas(replicas)

        self._loop.run_until_complete(_update())

    def _route(self, text: str, request_id: str) -> str:
        from ray.serve._private.common import RequestMetadata
        from ray.serve._private.request_router import PendingRequest

        async def _choose() -> tuple[Any, Any]:
            pending = PendingRequest(
                args=[_Prompt(text)],
                kwargs={},
                metadata=RequestMetadata(request_id=request_id, internal_request_id=uuid.uuid4().hex),
                created_at=self.now_s,
            )
            replica = await self.router._choose_replica_for_request(pending)
            return pending, replica

        pending, replica = self._loop.run_until_complete(_choose())
        self.router.on_request_routed(pending, replica.replica_id, None)  # inserts the prompt
        return replica.replica_id.unique_id

    # ----- the simulator's router protocol (router_sim_cluster.SimRouter) -------------------
    def choose(self, req: Any, now_s: float) -> str:
        self.now_s = now_s
        replica_id = self._route(req.text(), req.request_id)
        self.in_flight[replica_id] += 1
        self._replica_of[req.request_id] = replica_id
        return replica_id

    def on_completed(self, req: Any, now_s: float) -> None:
        self.in_flight[self._replica_of.pop(req.request_id)] -= 1

    def on_kv_events(self, replica_id: str, events: list) -> None:
        pass  # Ray's router learns only from its own routing

    def on_stats(self, replica_id: str, stats: Any) -> None:
        pass

    # ----- latency measurement hooks --------------------------------------------------------
    def preload(self, text: str, replica_id: str) -> None:
        import ray

        ray.get(self._tree_actor.insert.remote(text, self._tenant[replica_id], 0.0))

    def close(self) -> None:
        import ray

        ray.kill(self._tree_actor)
        self._loop.close()
