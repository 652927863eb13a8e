"""The TT engine's health check can fail: device probe, stalled step loop, dead thread."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

from accel.contract import GenerateRequest
from accel.tt.config import TTEngineConfig
from accel.tt.engine import TTMeshEngine
from accel.tt.health import DeviceProbe, EngineUnhealthy, device_probe, stalled_problem
from accel.tt.scripted_model import ScriptedMeshModel

from .engine_harness import greedy


def test_device_probe_reports_a_probe_that_does_not_return():
    gate = threading.Event()
    now = [0.0]
    probe = DeviceProbe(gate.wait, timeout_s=5.0, clock=lambda: now[0])
    assert probe.problem() is None  # starts the probe
    now[0] = 4.0
    assert probe.problem() is None  # in flight, within the bound; no second probe started
    now[0] = 6.0
    assert "has not answered a probe for 6.0 s" in probe.problem()
    gate.set()
    deadline = time.monotonic() + 5
    while probe._started_at is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert probe.problem() is None  # answered; a new probe starts


def test_device_probe_reports_a_failed_probe():
    def boom():
        raise RuntimeError("TT_FATAL device lost")

    probe = DeviceProbe(boom, timeout_s=5.0)
    assert probe.problem() is None
    deadline = time.monotonic() + 5
    while probe._started_at is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "RuntimeError: TT_FATAL device lost" in probe.problem()


def test_device_probe_is_the_models_ping_else_ttnn_synchronize_device(ttnn_stub):
    model = ScriptedMeshModel.__new__(ScriptedMeshModel)
    assert device_probe(model, None) == model.device_ping  # the torch programs answer themselves
    ttnn_stub._stub_simulate(1)
    mesh = object()
    probe = device_probe(object(), SimpleNamespace(kind="ttnn", ttnn=ttnn_stub, mesh_device=mesh))
    probe()
    assert ttnn_stub._stub_calls[-1][:2] == ("synchronize_device", (mesh,))
    assert device_probe(object(), SimpleNamespace(kind="ttnn", ttnn=ttnn_stub, mesh_device=None)) is None
    assert device_probe(object(), SimpleNamespace(kind="torch")) is None


def test_stalled_problem_needs_work_in_flight():
    assert stalled_problem(last_iteration_at=0.0, num_inflight=0, step_timeout_s=1.0, now=100.0) is None
    assert stalled_problem(last_iteration_at=99.5, num_inflight=3, step_timeout_s=1.0, now=100.0) is None
    assert "for 100.0 s while 3 request(s)" in stalled_problem(
        last_iteration_at=0.0, num_inflight=3, step_timeout_s=1.0, now=100.0
    )


class HangingModel(ScriptedMeshModel):
    """Decode hangs (on the "device" thread) until ``release`` is set."""

    release = threading.Event()

    def decode_forward(self, *args, **kwargs):
        type(self).release.wait()
        return super().decode_forward(*args, **kwargs)


def test_a_hung_step_fails_the_engine_health_check(tiny_llama):
    config = TTEngineConfig.from_engine_args(
        dict(model=str(tiny_llama), max_num_seqs=2, block_size=16, max_model_len=128, additional_config={"tt": {}})
    )
    HangingModel.release.clear()
    engine = TTMeshEngine(config, model_class=HangingModel, step_timeout_s=0.3)

    async def run():
        await engine.check_health()  # idle: healthy
        task = asyncio.create_task(anext(engine.generate(GenerateRequest("h", (5, 6, 7), greedy(4)))))
        await asyncio.sleep(0.6)  # prefill done, decode hangs
        with pytest.raises(EngineUnhealthy, match="step loop has not completed an iteration"):
            await engine.check_health()
        HangingModel.release.set()
        await asyncio.wait_for(task, timeout=5)

    try:
        asyncio.run(run())
    finally:
        HangingModel.release.set()
        engine.close()
    with pytest.raises(EngineUnhealthy, match="not running"):
        asyncio.run(engine.check_health())
