"""What an engine replica of a prefill or decode pool needs for KV transfer.

Pools with ``role: prefill`` or ``role: decode`` get the application's KV-connector actor
(created on first use, one per Serve application) and:
- TT engines: ``accel.tt.kv_hooks.KVTransferHooks`` over ``RayKVTransport``;
- vLLM engines on CPU/CUDA: ``kv_transfer_config`` loading ``MeshServeConnector``
  (``accel.tpu.kv_connector``) in vLLM's child processes, which join the cluster by the GCS
  address given here; a ``kv_transfer_config`` in the pool's engine_args is left as is.
- vLLM engines on TPU: nothing here. TPU backends accept only their own connectors; configure
  ``TPUConnector`` in the pool's engine_args (see ``accel/tpu/kv_connector.py`` for that data path).
"""

from __future__ import annotations

import logging
from typing import Any

from serve_app.config import PoolConfig

logger = logging.getLogger(__name__)

PD_ROLES = ("prefill", "decode")


def app_name() -> str:
    """The Serve application this replica belongs to (names the KV-connector actor)."""
    try:
        from ray import serve
        return serve.get_replica_context().app_name or "default"
    except Exception:
        return "default"


def tt_kv_hooks(pool: PoolConfig) -> Any:
    if pool.role not in PD_ROLES:
        return None
    from accel.tt.kv_hooks import KVTransferHooks
    from deployments.kv_connector_actor import get_or_create_kv_connector
    from deployments.kv_connector_client import RayKVTransport

    name = app_name()
    get_or_create_kv_connector(name)
    logger.info("pool %s (%s): KV transfer through the %r KV connector", pool.name, pool.role, name)
    return KVTransferHooks(RayKVTransport(name), pool.engine_args_for_engine()["model"])


def vllm_kv_transfer_config(pool: PoolConfig) -> dict[str, Any] | None:
    if pool.role not in PD_ROLES or pool.accelerator == "tpu" or pool.engine_args.get("kv_transfer_config"):
        return None
    import ray

    from deployments.kv_connector_actor import get_or_create_kv_connector

    name = app_name()
    get_or_create_kv_connector(name)
    return {"kv_connector": "MeshServeConnector", "kv_connector_module_path": "accel.tpu.kv_connector",
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"app_name": name,
                                          "ray_address": ray.get_runtime_context().gcs_address}}
