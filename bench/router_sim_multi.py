"""Several router replicas in the router simulator: how much affinity survives splitting the
decisions over N independent ``RouterLogic``s, the way the router deployment runs them.

Each request goes to the router replica its affinity key picks by rendezvous hashing
(``deployments.handle_routing.rendezvous``, key = ``RouteRequest.affinity_key``: session, else first prompt
block, else request id), and its completion goes back to that replica. Every replica gets every
engine's KV events (each follows each engine's event log from its own cursor) and every stats
report, with the engine's own in-flight count; and, as the router deployment does, each publishes
its own in-flight counts to the others every ``PEER_LOAD_PERIOD_S`` of simulated time
(``peer_period_s``; None = never, leaving only the engine-reported counts, as old as the last
stats report). In ``approximate`` mode a replica learns its index only from its own decisions, so
the split costs hit rate there; ``precise`` mode should lose little.
"""

from __future__ import annotations

from collections.abc import Sequence

from router_sim_core import CoreSimRouter
from router_sim_workload import TraceRequest

from accel.contract import EngineStats
from deployments.config.router import CostWeights
from deployments.handle_routing.rendezvous import rendezvous_order
from deployments.messages.kv_events import KVEvent
from deployments.messages.routing import RouteRequest
from deployments.router.logic.load import PEER_LOAD_PERIOD_S


class MultiCoreSimRouter:
    def __init__(
        self,
        num_routers: int,
        policy: str,
        index_mode: str,
        replica_ids: Sequence[str],
        num_kv_blocks: int,
        block_size: int,
        weights: CostWeights,
        peer_period_s: float | None = PEER_LOAD_PERIOD_S,
    ) -> None:
        self.routers = {
            f"router-{i}": CoreSimRouter(policy, index_mode, replica_ids, num_kv_blocks, block_size, weights)
            for i in range(num_routers)
        }
        self._router_ids = sorted(self.routers)
        self._router_of: dict[str, str] = {}  # request id -> router replica that decided it
        self._peer_period_s = peer_period_s
        self._next_publish_s = 0.0

    def _owner(self, req: TraceRequest) -> str:
        key = RouteRequest(
            req.request_id,
            "sim",
            len(req.prompt_token_ids),
            session_id=req.session_id,
            prompt_block_hashes=tuple(req.prompt_hashes[:1]),
        ).affinity_key
        return rendezvous_order(key, self._router_ids)[0]

    def _tick(self, now_s: float) -> None:
        for router in self.routers.values():  # one simulated clock for all router replicas
            router.now_s = now_s
        if self._peer_period_s is not None and now_s >= self._next_publish_s:
            self._next_publish_s = now_s + self._peer_period_s
            for name, router in self.routers.items():  # every router's broadcast of its counts
                counts = router.logic.in_flight_counts()
                for peer_name, peer in self.routers.items():
                    if peer_name != name:
                        peer.logic.apply_peer_in_flight(name, counts)

    def choose(self, req: TraceRequest, now_s: float) -> str:
        self._tick(now_s)
        owner = self._owner(req)
        self._router_of[req.request_id] = owner
        return self.routers[owner].choose(req, now_s)

    def on_completed(self, req: TraceRequest, now_s: float) -> None:
        self._tick(now_s)
        self.routers[self._router_of.pop(req.request_id)].on_completed(req, now_s)

    def on_kv_events(self, replica_id: str, events: list[KVEvent]) -> None:
        for router in self.routers.values():
            router.on_kv_events(replica_id, events)

    def on_stats(self, replica_id: str, stats: EngineStats) -> None:
        # The engine replica's own count of requests it serves: every router's in flight there.
        num_in_flight = sum(r.logic.num_in_flight(replica_id) for r in self.routers.values())
        for router in self.routers.values():
            router.logic.apply_stats(replica_id, stats, num_in_flight)
