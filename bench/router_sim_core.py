"""``CoreSimRouter``: our ``RouterCore`` driven by the router simulator (clock = simulated time)."""

from __future__ import annotations

from collections.abc import Sequence

from router_sim_workload import TraceRequest

from accel.contract import EngineStats
from deployments.router.core.policy import CostWeights
from deployments.router.core.router_core import ReplicaInfo, RequestInfo, RouterConfig, RouterCore
from deployments.router.kv_events import BlockStored, KVEvent

MODEL = "sim-model"


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
        config = RouterConfig(policy=policy, index_mode=index_mode, block_size=block_size, weights=weights)
        self.core = RouterCore(config, clock=lambda: self.now_s)
        for r in replica_ids:
            self.core.add_replica(ReplicaInfo(r, (MODEL,), num_kv_blocks))

    @staticmethod
    def request_info(req: TraceRequest) -> RequestInfo:
        return RequestInfo(
            req.request_id,
            MODEL,
            session_key=req.session_key,
            block_hashes=req.prompt_hashes,
            num_prompt_tokens_hint=len(req.prompt_token_ids),
        )

    def choose(self, req: TraceRequest, now_s: float) -> str:
        self.now_s = now_s
        replica_id = self.core.route(self.request_info(req)).replica_id
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
