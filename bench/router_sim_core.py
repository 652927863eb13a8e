"""``CoreSimRouter``: our ``RouterCore`` driven by the router simulator (clock = simulated time)."""

from __future__ import annotations

from collections.abc import Sequence

from router_sim_workload import TraceRequest

from accel.contract import EngineStats
from deployments.router.core.router_core import ReplicaInfo, RouterCore
from deployments.router.kv_events import BlockStored, KVEvent
from deployments.router.messages import RouteRequest
from serve_app.config.router import CostWeights, ModelRouting, RouterConfig

MODEL = "sim-model"
POOL = "sim-pool"


class CoreSimRouter:
    """A ``RouterCore`` driven by the simulator (clock = simulated time).

    ``speculative`` (a prototype, not the core's behaviour): in precise mode, also record the
    chosen replica's prompt blocks at dispatch, as if the engine had reported them already — what
    llm-d's ``speculativeIndexing`` and vllm-router's kv_aware ``speculative_insert`` do to bridge
    the KV-event lag (here without their TTL: a prediction the engine never confirms stays until
    the index's LRU bound drops it)."""

    def __init__(
        self,
        policy: str,
        index_mode: str,
        replica_ids: Sequence[str],
        num_kv_blocks: int,
        block_size: int,
        weights: CostWeights,
        speculative: bool = False,
    ) -> None:
        self.now_s = 0.0
        self._speculative = speculative
        config = RouterConfig(policy=policy, index_mode=index_mode, weights=weights)
        self.core = RouterCore(config, {MODEL: ModelRouting(block_size)}, clock=lambda: self.now_s)
        for r in replica_ids:
            self.core.add_replica(ReplicaInfo(r, POOL, MODEL, num_kv_blocks))

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
        replica_id = self.core.route(self.route_request(req)).replica_id
        assert replica_id is not None
        if self._speculative and req.prompt_hashes:
            self.core.apply_kv_events(replica_id, [BlockStored(req.prompt_hashes)])
        return replica_id

    def on_completed(self, req: TraceRequest, now_s: float) -> None:
        self.now_s = now_s
        self.core.on_completed(req.request_id)

    def on_kv_events(self, replica_id: str, events: list[KVEvent]) -> None:
        self.core.apply_kv_events(replica_id, events)

    def on_stats(self, replica_id: str, stats: EngineStats) -> None:
        self.core.apply_stats(replica_id, stats)
