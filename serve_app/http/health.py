"""Which served models can answer now, for ``/health`` (503 unless every served model can) and
``/v1/models`` (only the models that can).

A model can serve when one of its pools that runs whole requests (role ``both`` or ``decode``;
a prefill pool alone cannot finish a request) has a running replica, as Serve last told this
ingress process (``EnginePoolClient.running_replicas``: Serve's controller pushes every change —
started, stopped, failed its health check — and a call that finds a replica's actor dead drops it
at once). Not heard of yet (just after start) counts as not serving: a readiness probe waits.
"""

from __future__ import annotations

from collections.abc import Mapping

from deployments.config.app import ModelConfig
from deployments.replicas.client import PoolClient

SERVING_ROLES = ("both", "decode")


def model_can_serve(model: ModelConfig, engines: Mapping[str, PoolClient]) -> bool:
    for pool in model.pools:
        if pool.role not in SERVING_ROLES or pool.name not in engines:
            continue
        running = engines[pool.name].running_replicas()
        if running:
            return True
    return False


def unhealthy_models(models: Mapping[str, ModelConfig], engines: Mapping[str, PoolClient]) -> list[str]:
    return [name for name, m in models.items() if not model_can_serve(m, engines)]
