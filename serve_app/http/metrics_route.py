"""``GET /metrics`` on the API port, as ``vllm serve`` has it: Prometheus text with vLLM 0.32's
``vllm:*`` names and labels (``model_name``, ``engine``), so a scrape config written for vLLM
works unchanged, plus meshserve's own ``meshserve:*`` series.

At each scrape the ingress asks every engine replica of every pool for its snapshot
(``EngineReplica.metrics_snapshot``, one broadcast per pool, all pools at once, each within
``SCRAPE_TIMEOUT_S``). A dead replica is left out and counted in
``meshserve:metrics_replicas{outcome="failed"}``; a pool whose broadcast does not complete in
time (a hung replica) is left out whole, counted as one failure (Serve's broadcast has one
deadline for all its replicas). The router replicas' ``meshserve:router_*``
series are gathered the same way, and the KV-connector actor's ``meshserve:kv_*`` (an app with
a prefill pool: ``kv_metrics_source``). The snapshots are summed
(``deployments.telemetry.merge``): one series per model and engine index over its replicas,
across pools and engine kinds, as one vLLM server with that many engines would show them. The
ingress's own counters are this ingress replica's (a scrape through HAProxy reaches one of
them; with several ingress replicas scrape each on its own port).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from fastapi.responses import Response

from deployments.telemetry.exposition import CONTENT_TYPE, render
from deployments.telemetry.ingress_prometheus import IngressPrometheus, scrape_families
from deployments.telemetry.merge import merge_snapshots
from deployments.telemetry.snapshot import MetricsSnapshot

SCRAPE_TIMEOUT_S = 2.0


class SnapshotSource(Protocol):
    """A pool client that can gather its replicas' snapshots (``EnginePoolClient``,
    ``LocalPoolClient``)."""

    async def metrics_snapshots(self, timeout_s: float) -> list[MetricsSnapshot | BaseException]: ...


async def gather_engine_snapshots(
    pools: Mapping[str, object], timeout_s: float = SCRAPE_TIMEOUT_S
) -> tuple[list[MetricsSnapshot], dict[str, tuple[int, int]]]:
    """Every pool's replica snapshots, and per pool (answered, failed)."""
    sources = {name: pool for name, pool in pools.items() if hasattr(pool, "metrics_snapshots")}
    calls = [_pool_snapshots(source, timeout_s) for source in sources.values()]
    answers = await asyncio.gather(*calls)
    snapshots: list[MetricsSnapshot] = []
    counts: dict[str, tuple[int, int]] = {}
    for name, answer in zip(sources, answers):
        ok = [a for a in answer if isinstance(a, MetricsSnapshot)]
        snapshots += ok
        counts[name] = (len(ok), len(answer) - len(ok))
    return snapshots, counts


async def _pool_snapshots(source: SnapshotSource, timeout_s: float) -> list[MetricsSnapshot | BaseException]:
    try:
        return await asyncio.wait_for(source.metrics_snapshots(timeout_s), timeout_s + 0.5)
    except Exception as exc:  # (the pool's deployment gone, a handle that failed)
        return [exc]


async def _snapshots_of(source: SnapshotSource | None, timeout_s: float) -> list[MetricsSnapshot | BaseException]:
    return [] if source is None else await _pool_snapshots(source, timeout_s)


async def metrics(
    pools: Mapping[str, object],
    ingress: IngressPrometheus | None,
    inflight: int,
    timeout_s: float = SCRAPE_TIMEOUT_S,
    router: SnapshotSource | None = None,
    kv: SnapshotSource | None = None,
) -> Response:
    """The body of ``GET /metrics``: the engines' series summed, then meshserve's own (the
    router replicas' summed, the KV connector's, this ingress replica's)."""
    (snapshots, counts), routers, kvs = await asyncio.gather(
        gather_engine_snapshots(pools, timeout_s), _snapshots_of(router, timeout_s), _snapshots_of(kv, timeout_s)
    )
    merged = merge_snapshots(snapshots)
    own = [scrape_families(inflight, counts)]
    own += [merge_snapshots(a for a in answers if isinstance(a, MetricsSnapshot)) for answers in (routers, kvs)]
    own += [ingress.snapshot()] if ingress is not None else []
    body = render(MetricsSnapshot(merged.families + tuple(f for s in own for f in s.families)))
    return Response(content=body, media_type=CONTENT_TYPE)
