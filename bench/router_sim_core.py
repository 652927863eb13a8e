"""``CoreSimRouter``: our ``RouterLogic`` driven by the router simulator (clock = simulated time)."""

from __future__ import annotations

from collections.abc import Sequence

from router_sim_workload import TraceRequest

from accel.contract import EngineStats
from deployments.config.router import CostWeights, ModelRouting, RouterConfig
from deployments.messages.kv_events import KVEvent
from deployments.messages.routing import RouteRequest
from deployments.router.logic.router_logic import ReplicaInfo, RouterLogic

MODEL = "sim-model"
POOL = "sim-pool"


class CoreSimRouter:
    """A ``RouterLogic`` driven by the simulator (clock = simulated time). ``speculative_ttl_s``:
    the precise index's speculative entries (``RouterConfig.speculative_ttl_s``; None = the
    config default, 0 = off)."""

    def __init__(
        self,
        policy: str,
        index_mode: str,
        replica_ids: Sequence[str],
        num_kv_blocks: int,
        block_size: int,
        weights: CostWeights,
        speculative_ttl_s: float | None = None,
    ) -> None:
        self.now_s = 0.0
        ttl = RouterConfig.speculative_ttl_s if speculative_ttl_s is None else speculative_ttl_s
        config = RouterConfig(policy=policy, index_mode=index_mode, weights=weights, speculative_ttl_s=ttl)
        self.logic = RouterLogic(config, {MODEL: ModelRouting(block_size)}, clock=lambda: self.now_s)
        for r in replica_ids:
            self.logic.add_replica(ReplicaInfo(r, POOL, MODEL, num_kv_blocks))

    @staticmethod
    def route_request(req: TraceRequest) -> RouteRequest:
        """What the ingress would send the router for ``req``."""
        return RouteRequest(
            req.request_id,
            MODEL,
            len(req.prompt_token_ids),
            session_id=req.session_id,
            prompt_block_hashes=req.prompt_hashes,
        )

    def choose(self, req: TraceRequest, now_s: float) -> str:
        self.now_s = now_s
        replica_id = self.logic.route(self.route_request(req)).replica_id
        assert replica_id is not None
        return replica_id

    def on_completed(self, req: TraceRequest, now_s: float) -> None:
        self.now_s = now_s
        self.logic.on_completed(req.request_id)

    def on_kv_events(self, replica_id: str, events: list[KVEvent]) -> None:
        self.logic.apply_kv_events(replica_id, events)

    def on_stats(self, replica_id: str, stats: EngineStats) -> None:
        self.logic.apply_stats(replica_id, stats)
