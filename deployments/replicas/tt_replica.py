"""The TT mesh replica: one ``TTMeshEngine`` (all lanes of one mesh) per Serve replica.

On Tenstorrent hosts (accelerator ``tt``) the replica asks Ray 2.60 for ``TTNPU`` = the mesh's
chip count (Ray then sets ``TT_VISIBLE_DEVICES``) and gets ``MESH_DEVICE`` in its environment,
which tt-metal reads to open the mesh. Elsewhere (accelerator ``cpu``) it runs the torch mesh
model on CPU and asks for CPU only.
"""

from __future__ import annotations

import re
from typing import Any

from accel.contract import ConfigError, Engine
from accel.tt.config import TTEngineConfig
from accel.tt.engine import TTMeshEngine
from deployments.config.app import PoolConfig
from deployments.pd.wiring import tt_kv_hooks
from deployments.replicas.engine_replica import EngineFactory, EngineReplica
from deployments.replicas.kv_event_log import DEFAULT_CAPACITY_EVENTS

# tt-metal's MESH_DEVICE presets (utils/dp_discovery.py) -> chips in the mesh.
MESH_DEVICE_CHIPS = {
    "N150": 1,
    "P100": 1,
    "P150": 1,
    "N300": 2,
    "P300": 2,
    "P150x2": 2,
    "N150x4": 4,
    "P150x4": 4,
    "P300x2": 4,
    "T3K": 8,
    "P150x8": 8,
    "TG": 32,
    "BH-Galaxy": 32,
}


def mesh_chip_count(mesh_device: str) -> int:
    """Chips in a MESH_DEVICE preset or a literal ``"(r, c)"`` grid."""
    if mesh_device in MESH_DEVICE_CHIPS:
        return MESH_DEVICE_CHIPS[mesh_device]
    m = re.fullmatch(r"\(\s*(\d+)\s*,\s*(\d+)\s*\)", mesh_device)
    if m:
        return int(m.group(1)) * int(m.group(2))
    raise ConfigError(f"unknown MESH_DEVICE {mesh_device!r}; one of {sorted(MESH_DEVICE_CHIPS)} or '(r, c)'")


def make_tt_engine(pool: PoolConfig) -> Engine:
    """The pool's TT engine, built from the engine config the config loader parsed:
    ``TTMeshEngine.in_engine_process`` with ``additional_config.tt.engine_core_process``, else
    ``TTMeshEngine`` with its step loop on a thread here (and the pool's PD KV hooks)."""
    if not isinstance(pool.engine_config, TTEngineConfig):
        raise ConfigError(f"pool {pool.name!r}: a TT replica needs a TT engine config")
    if pool.engine_config.tt.engine_core_process:  # (the loader refuses it on PD pools)
        return TTMeshEngine.in_engine_process(
            pool.engine_config, step_timeout_s=pool.step_timeout_s, accelerator=pool.accelerator
        )
    return TTMeshEngine(
        pool.engine_config,
        kv_hooks=tt_kv_hooks(pool),
        step_timeout_s=pool.step_timeout_s,
        accelerator=pool.accelerator,
    )


def deployment_options(pool: PoolConfig) -> dict[str, Any]:
    """Serve deployment options (resources) of a TT pool's replicas."""
    actor: dict[str, Any] = {"num_cpus": pool.num_cpus}
    resources = dict(pool.extra_resources)
    if pool.accelerator == "tt":
        assert pool.tt_mesh_device is not None
        resources["TTNPU"] = mesh_chip_count(pool.tt_mesh_device)
        actor["runtime_env"] = {"env_vars": {"MESH_DEVICE": pool.tt_mesh_device}}
    if resources:
        actor["resources"] = resources
    if pool.memory_bytes:
        actor["memory"] = pool.memory_bytes
    return {"ray_actor_options": actor}


class TTMeshReplica(EngineReplica):
    def __init__(
        self,
        pool: PoolConfig,
        engine_factory: EngineFactory | None = None,
        kv_event_log_size: int = DEFAULT_CAPACITY_EVENTS,
    ):
        super().__init__(pool, engine_factory or make_tt_engine, kv_event_log_size=kv_event_log_size)
