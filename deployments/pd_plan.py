"""When a request is disaggregated, and where: the PD part of a routing decision (pure logic).

A request goes prefill pool -> decode pool when no pool was pinned, its prompt has at least
``threshold_tokens`` tokens and its model has both a ``prefill`` and a ``decode`` pool. Within
each pool the least-loaded known replica is chosen (ties by replica id, so equal replicas are
picked deterministically); with no replica known yet the pool's handle chooses (replica None).

Pools on TPU take no part: TPU backends load only their own KV connectors, so our KV cannot
leave or enter a TPU engine, and TPU<->TPU hand-off through ``TPUConnector`` params is not wired
(see ``accel/tpu/kv_connector.py``). Planning PD there would only add a failed prefill before the
decode side recomputes; such requests run whole on the decode pool instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from deployments.route_types import PoolInfo, ReplicaLoad, RouteRequest

Placement = tuple[str, str | None]  # (pool name, replica id or None)


def plan_pd(request: RouteRequest, pools: Sequence[PoolInfo], replicas: Sequence[ReplicaLoad],
            threshold_tokens: int | None) -> tuple[Placement, Placement] | None:
    """((prefill pool, replica), (decode pool, replica)), or None for a colocated request."""
    if threshold_tokens is None or request.pool is not None or request.num_prompt_tokens < threshold_tokens:
        return None
    prefill = [p.name for p in pools if p.model == request.model and p.role == "prefill" and p.accelerator != "tpu"]
    decode = [p.name for p in pools if p.model == request.model and p.role == "decode" and p.accelerator != "tpu"]
    if not prefill or not decode:
        return None
    return _least_loaded(prefill, replicas), _least_loaded(decode, replicas)


def _least_loaded(pool_names: list[str], replicas: Sequence[ReplicaLoad]) -> Placement:
    candidates = [r for r in replicas if r.pool in pool_names]
    if not candidates:
        return pool_names[0], None
    best = min(candidates, key=lambda r: (r.load, r.replica_id))
    return best.pool, best.replica_id
