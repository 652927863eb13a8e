"""RouterLogic fixtures shared by the core's tests: a fake clock, a core over N replicas of one
pool, and a request as the ingress builds it."""

from __future__ import annotations

from accel.block_hash import hash_prompt_blocks
from deployments.config.router import ModelRouting, RouterConfig
from deployments.messages.routing import RouteRequest
from deployments.router.logic.router_logic import ReplicaInfo, RouterLogic

BS = 4
SYSTEM = tuple(range(100, 164))  # 16 blocks


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def core_with(num_replicas: int = 4, pd_threshold_tokens: int | None = None, **config) -> RouterLogic:
    models = {"m": ModelRouting(BS, pd_threshold_tokens), "m2": ModelRouting(BS)}
    # approximate unless a test asks for precise: these tests teach the index by routing
    core = RouterLogic(RouterConfig(**{"index_mode": "approximate", **config}), models, clock=Clock())
    for i in range(num_replicas):
        core.add_replica(ReplicaInfo(f"r{i}", "pool", "m", 1000))
    return core


def req(
    request_id: str,
    tokens: tuple[int, ...],
    session: str | None = None,
    model: str = "m",
    block_size: int = BS,
    **kw,
) -> RouteRequest:
    """A request for ``tokens`` as the ingress sends it: prompt hashes at the routing block size."""
    hashes = tuple(hash_prompt_blocks(tokens, block_size))
    return RouteRequest(request_id, model, len(tokens), session_id=session, prompt_block_hashes=hashes, **kw)
