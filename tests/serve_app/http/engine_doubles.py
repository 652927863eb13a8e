"""Doubles of what the ingress's ``EngineClient`` talks to, written from Ray Serve's handle API:
a router handle (``choose`` / ``release`` calls and ``broadcast``), engine pool handles
(``options(stream=...).generate.remote``) and their delta streams; plus the client built on them."""

from __future__ import annotations

import asyncio

from accel.contract import FinishReason, GenerateRequest, OutputDelta
from deployments.config.ingress import IngressConfig
from deployments.config.router import RouterConfig
from serve_app.http.engine_client import EngineClient
from tests.doubles.app_configs import app_config, pool_config

POOLS = (pool_config("tt", "m", "tt", "cpu", "both"), pool_config("vllm", "m", "vllm", "cpu", "both"))
REQ = GenerateRequest("r", (1, 2))


def delta(rid, n, done=False):
    return OutputDelta(rid, (n,), str(n), 2, n, finish_reason=FinishReason.LENGTH if done else None)


class FakeResponse:
    def __init__(self, value=None, delay_s=0.0, error=None):
        self._value, self._delay_s, self._error = value, delay_s, error

    def __await__(self):
        async def get():
            await asyncio.sleep(self._delay_s)
            if self._error:
                raise self._error
            return self._value

        return get().__await__()


class FakeMethod:
    def __init__(self, fn):
        self.remote = fn


class FakeBroadcast:
    def __init__(self, record):
        self._record = record

    async def results_async(self, return_exceptions=False):
        self._record()
        return [None]


class FakeRouterHandle:
    """``choose`` answers ``decision`` (or a list of them, one per call); ``release`` records the
    ticket and its router-replica hint; broadcasts (``forget``, ``report_dead``) are recorded."""

    def __init__(self, decision=None, delay_s=0.0, error=None):
        self.released, self.hints, self.routes = [], [], []
        decisions = decision if isinstance(decision, list) else None

        def choose(route):
            self.routes.append(route)
            return FakeResponse(decisions.pop(0) if decisions else decision, delay_s, error)

        def release(ticket, replica_hint=None):
            self.released.append(ticket)
            self.hints.append(replica_hint)

        self.choose = FakeMethod(choose)
        self.release = FakeMethod(release)
        self.forgotten, self.dead_reports = [], []
        self.options_seen: dict = {}

    def options(self, **options):
        """``DeploymentHandle.options`` (keyword-only; answers a copy with them set): the same
        methods, the options recorded."""
        self.options_seen = options
        return self

    def broadcast(self, method, *args):
        target = {"forget": self.forgotten, "report_dead": self.dead_reports}[method]
        return FakeBroadcast(lambda: target.append(args[0] if method == "forget" else args))


class FakeStream:
    def __init__(self, deltas, error=None):
        self._deltas, self._error, self.cancelled = list(deltas), error, False

    def __aiter__(self):
        return self

    async def __anext__(self):
        await asyncio.sleep(0)
        if self._deltas:
            return self._deltas.pop(0)
        if self._error:
            raise self._error
        raise StopAsyncIteration

    def cancel(self):
        self.cancelled = True


class FakePoolHandle:
    def __init__(self, make_stream):
        self.calls = []
        self._make = make_stream
        self.generate = FakeMethod(self._call)

    def options(self, **options):
        """``DeploymentHandle.options`` (keyword-only): the options recorded."""
        self.options_seen = options
        return self

    def _call(self, request, replica_hint=None):
        self.calls.append((request.request_id, replica_hint))
        self.last = self._make(request)
        return self.last


def make_client(router, pools=None, metrics=None):
    pools = pools or {
        "tt": FakePoolHandle(lambda r: FakeStream([delta(r.request_id, 1), delta(r.request_id, 2, True)])),
        "vllm": FakePoolHandle(lambda r: FakeStream([delta(r.request_id, 1, True)])),
    }
    config = app_config(POOLS, RouterConfig(decision_timeout_s=0.05), ingress=IngressConfig(retry_after_s=2))
    return EngineClient(config, router, pools, metrics=metrics), pools


def dead_actor_error():
    """What a call to a dead replica actor raises."""
    from ray.exceptions import ActorUnavailableError

    return ActorUnavailableError("Actor is unavailable.", bytes.fromhex("ab" * 16))
