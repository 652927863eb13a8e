"""What an engine replica of a prefill or decode pool needs for KV transfer.

Pools with ``role: prefill`` or ``role: decode`` get the application's KV-connector actor
(created on first use, one per Serve application) and, by KV path (``deployments.config.pd``):
- TT engines: ``accel.tt.kv_hooks.KVTransferHooks`` over ``RayKVTransport`` (path ``meshserve``);
- vLLM engines whose engine_args set no ``kv_transfer_config`` (off TPU): one loading
  ``MeshServeConnector`` (``accel.vllm.kv_connector``) in vLLM's child processes, which join the
  cluster by the GCS address given here (path ``meshserve``: pairs with TT engines too);
- vLLM engines whose engine_args set their own ``kv_transfer_config`` (TPU: ``TPUConnector``,
  the only kind TPU backends load): that connector moves the KV engine to engine, and the replica
  gets a ``NativeKVHandoff`` that passes the connector's ``kv_transfer_params`` from the prefill
  engine to the decode engine unchanged through the actor (``deployments.pd.native_handoff``).
  ``MeshServeConnector`` named there (the CPU stand-in for ``TPUConnector`` in tests) gets the
  application's name and GCS address filled in when its extra config leaves them out.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray import serve

from accel.tt.kv_hooks import KVTransferHooks
from accel.vllm.config import VllmEngineConfig
from deployments.config.app import PoolConfig
from deployments.config.pd import PD_ROLES, is_native
from deployments.kv.connector_actor import get_or_create_kv_connector
from deployments.kv.ray_transport import RayKVTransport
from deployments.pd.native_handoff import ActorParamsStore, NativeKVHandoff

logger = logging.getLogger(__name__)

MESHSERVE_CONNECTOR = "MeshServeConnector"


def app_name() -> str:
    """The Serve application this replica belongs to (names the KV-connector actor)."""
    try:
        return serve.get_replica_context().app_name or "default"
    except Exception:
        return "default"


def tt_kv_hooks(pool: PoolConfig) -> Any:
    if pool.role not in PD_ROLES:
        return None
    name = app_name()
    get_or_create_kv_connector(name)
    logger.info("pool %s (%s): KV transfer through the %r KV connector", pool.name, pool.role, name)
    transport = RayKVTransport(name)
    transport.serve_other_nodes()
    return KVTransferHooks(transport, pool.engine_config.model)


def vllm_kv_transfer_config(pool: PoolConfig) -> dict[str, Any] | None:
    """The ``kv_transfer_config`` the pool's engine loads; None = none (not a PD pool, or a TPU
    pool the config builder already refused)."""
    if pool.role not in PD_ROLES or not isinstance(pool.engine_config, VllmEngineConfig):
        return None
    own = pool.engine_config.kv_transfer_config
    if own:
        return _filled_in(dict(own)) if own.get("kv_connector") == MESHSERVE_CONNECTOR else dict(own)
    if pool.accelerator == "tpu":
        return None
    return _filled_in(
        {
            "kv_connector": MESHSERVE_CONNECTOR,
            "kv_connector_module_path": "accel.vllm.kv_connector",
            "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
        }
    )


def _filled_in(config: dict[str, Any]) -> dict[str, Any]:
    """``MeshServeConnector``'s extra config with this application's actor (created now) and
    cluster address, unless given."""
    extra = dict(config.get("kv_connector_extra_config") or {})
    extra.setdefault("app_name", app_name())
    extra.setdefault("ray_address", ray.get_runtime_context().gcs_address)
    extra.setdefault("transport", f"{RayKVTransport.__module__}:{RayKVTransport.__qualname__}")
    get_or_create_kv_connector(extra["app_name"])
    # The engine's children put into this node's store; its reader serves other nodes' consumers.
    RayKVTransport(extra["app_name"]).serve_other_nodes()
    return {**config, "kv_connector_extra_config": extra}


def native_kv_handoff(pool: PoolConfig) -> Any:
    """A ``NativeKVHandoff`` over the application's actor for a pool whose engine's own
    connector moves the KV; None otherwise."""
    if not is_native(pool):
        return None
    name = app_name()
    logger.info(
        "pool %s (%s): %s moves the KV; params through the %r KV connector",
        pool.name,
        pool.role,
        pool.kv_connector,
        name,
    )
    return NativeKVHandoff(ActorParamsStore(name))
