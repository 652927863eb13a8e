"""End to end: a TT replica whose engine hangs (a scripted mesh model that stops answering in a
decode) fails Serve's health check: every in-flight client gets an OpenAI error within seconds,
Serve replaces the replica, and nothing is left in flight."""

from __future__ import annotations

import concurrent.futures
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from accel.tt.scripted_model import ScriptedMeshModel
from tests.doubles.app_args import local_app_args
from tests.doubles.handle_loop import HANDLES

pytestmark = pytest.mark.slow

APP = "meshserve-hung"
DEPLOYMENT = "TTMeshReplica-tt"
STEP_TIMEOUT_S = 2.0
MARKER = Path(tempfile.gettempdir()) / "meshserve-hung-replica-marker"


class HangingMeshModel(ScriptedMeshModel):
    """Decodes normally until ``MARKER`` exists; from then on a decode never returns (a hung
    device). Removing the marker does not revive a hung instance, only spares new ones."""

    def decode_forward(self, *args, **kwargs):
        if MARKER.exists():
            threading.Event().wait()  # forever
        return super().decode_forward(*args, **kwargs)


def hanging_engine(pool):
    from accel.tt.engine import TTMeshEngine

    return TTMeshEngine(pool.engine_config, model_class=HangingMeshModel, step_timeout_s=pool.step_timeout_s)


@pytest.fixture(scope="module")
def base_url(serve_session, tiny_llama):
    from ray import serve

    from deployments.config.load import load_app_config
    from serve_app.app import build_from_config

    args = local_app_args()
    tt_pool = next(p for p in args["pools"] if p["name"] == "tt")
    args["pools"] = [dict(tt_pool, replicas=1, step_timeout_s=STEP_TIMEOUT_S)]
    args["router"]["index_mode"] = "approximate"
    MARKER.unlink(missing_ok=True)
    serve.run(build_from_config(load_app_config(args), {"tt": hanging_engine}), name=APP, route_prefix="/hung")
    try:
        yield f"{serve_session}/hung"
    finally:
        MARKER.unlink(missing_ok=True)
        serve.delete(APP)


async def _snapshots():
    from ray import serve

    handle = serve.get_deployment_handle(DEPLOYMENT, APP)
    return await handle.broadcast("routing_snapshot").results_async(timeout_s=30)


def _complete(base_url: str, max_tokens: int) -> httpx.Response:
    body = {"model": "tiny-llama", "prompt": [0, 5, 6, 7], "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(f"{base_url}/v1/completions", json=body, timeout=120)


def _serving_replica(base_url: str):
    """The one replica's snapshot once it has served a request. On a starved machine (this VM's
    speed varies) a fresh replica's first steps can outlast the test's 2 s step timeout, and the
    health check then replaces it — the behaviour under test, so wait for a replica that serves
    before the hang is armed."""
    deadline = time.monotonic() + 120
    while True:
        response = _complete(base_url, 4)
        if response.status_code == 200:
            snaps = HANDLES.call(_snapshots())
            if len(snaps) == 1:
                return snaps[0]
        assert time.monotonic() < deadline, response.text
        time.sleep(1)


def test_a_hung_engine_errors_its_clients_and_is_replaced(base_url):
    before = _serving_replica(base_url)
    MARKER.touch()
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        started = time.monotonic()
        responses = list(pool.map(lambda _: _complete(base_url, 50), range(3)))
        waited = time.monotonic() - started
    MARKER.unlink()
    for r in responses:
        assert r.status_code >= 500, r.text
        error = r.json()["error"]  # OpenAI's error shape; the ingress keeps internals in the log
        assert error["message"] and error["type"]
    # Serve's health check runs every 10 s; the check fails once nothing came for STEP_TIMEOUT_S.
    assert waited < 10 + STEP_TIMEOUT_S + 10
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            snaps = HANDLES.call(_snapshots())
        except Exception:
            snaps = []
        if snaps and all(s.replica_id != before.replica_id for s in snaps):
            break
        time.sleep(1)
    (after,) = snaps
    assert after.replica_id != before.replica_id  # Serve replaced the hung replica
    assert after.num_inflight == 0 and after.stats.num_running == 0 and after.stats.num_waiting == 0
    assert _complete(base_url, 4).status_code == 200  # the new replica serves
