"""The app's KV-connector actor as a source of ``GET /metrics`` series (``meshserve:kv_*``,
``deployments.telemetry.kv_families``): its ``stats()`` read at scrape time, within the scrape's
timeout. Only an app with a prefill pool has the actor (made by its first PD replica); before
it exists the source answers nothing. The actor's handle is looked up once (off the event loop:
``ray.get_actor`` blocks) and again after a failed call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ray import serve

from deployments.config.app import AppConfig
from deployments.kv.connector_actor import get_kv_connector
from deployments.kv.connector_client import KVConnectorClient
from deployments.telemetry.kv_families import kv_connector_snapshot
from deployments.telemetry.snapshot import MetricsSnapshot


class KVConnectorSource:
    def __init__(self, app_name: str, lookup: Callable[[str], KVConnectorClient] = get_kv_connector):
        self._app_name = app_name
        self._lookup = lookup
        self._client: KVConnectorClient | None = None

    async def metrics_snapshots(self, timeout_s: float) -> list[MetricsSnapshot | BaseException]:
        try:
            if self._client is None:
                self._client = await asyncio.wait_for(asyncio.to_thread(self._lookup, self._app_name), timeout_s)
        except ValueError:  # no actor (yet): nothing to show
            return []
        except Exception as exc:
            return [exc]
        try:
            stats: dict[str, Any] = await asyncio.wait_for(self._client.handle.stats.remote(), timeout_s)
        except Exception as exc:  # the actor died (Ray restarts it) or did not answer: look it up again
            self._client = None
            return [exc]
        return [kv_connector_snapshot(stats)]


_SOURCES: dict[str, KVConnectorSource] = {}  # app name -> its source (one per process: its cached handle)


def kv_source(config: AppConfig) -> KVConnectorSource | None:
    """The source of this Serve app, when it has a prefill pool (None without one, or outside
    Serve)."""
    if not any(p.role == "prefill" for p in config.pools):
        return None
    try:
        app_name = serve.get_replica_context().app_name
    except Exception:  # (not in a Serve replica)
        return None
    if app_name not in _SOURCES:
        _SOURCES[app_name] = KVConnectorSource(app_name)
    return _SOURCES[app_name]
