"""Kill the engine replica that is serving now, and wait for Serve to replace it: the fault the
failover tests inject mid-stream (no restart by Ray; Serve starts a new replica)."""

from __future__ import annotations

import time

from tests.doubles.handle_loop import HANDLES


async def _busy_replicas(app: str, deployment: str) -> list[str]:
    from ray import serve

    handle = serve.get_deployment_handle(deployment, app)
    snaps = await handle.broadcast("routing_snapshot", {}).results_async(timeout_s=30)
    return [s.replica_id for s in snaps if s.num_inflight > 0]


def kill_busy_replica(app: str, deployment: str) -> str:
    """Kill the one replica of ``deployment`` with a request in flight; returns its id."""
    import ray
    from ray.serve._private.common import DeploymentID, ReplicaID

    (victim,) = HANDLES.call(_busy_replicas(app, deployment))
    name = ReplicaID(victim, DeploymentID(name=deployment, app_name=app)).to_full_id_str()
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
    return victim


def wait_pool_size(app: str, deployment: str, n: int, timeout_s: float = 120) -> None:
    """Until ``n`` replicas of ``deployment`` answer."""
    from ray import serve

    async def size() -> int:
        handle = serve.get_deployment_handle(deployment, app)
        answers = await handle.broadcast("routing_snapshot", {}).results_async(return_exceptions=True)
        return sum(1 for a in answers if not isinstance(a, BaseException))

    deadline = time.monotonic() + timeout_s
    while HANDLES.call(size()) < n:
        assert time.monotonic() < deadline, f"{deployment} never got back to {n} replicas"
        time.sleep(0.5)


def stream_failovers(app_url: str, model: str) -> float:
    """``meshserve:stream_failovers_total`` of ``model`` on the app's ``GET /metrics``: the
    failovers the (one) ingress replica made, read before and after a stream to count its own."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    body = httpx.get(f"{app_url}/metrics", timeout=30)
    assert body.status_code == 200, body.text
    for family in text_string_to_metric_families(body.text):
        for sample in family.samples:
            if sample.name == "meshserve:stream_failovers_total" and sample.labels.get("model_name") == model:
                return sample.value
    return 0.0  # no failover of the model yet: prometheus_client shows no labelled series
