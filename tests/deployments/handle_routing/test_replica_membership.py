"""Serve's pushed running-replica sets reach the router deployment at once."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

from deployments.handle_routing import replica_membership
from deployments.handle_routing.pinned import PinnedReplicaRequestRouter


def test_subscribers_get_the_latest_set_then_each_change_once():
    seen: list[frozenset[str]] = []
    replica_membership.publish("app-m1", "pool", frozenset({"a", "b"}))
    unsubscribe = replica_membership.subscribe("app-m1", "pool", seen.append)
    replica_membership.publish("app-m1", "pool", frozenset({"a", "b"}))  # unchanged: not re-sent
    replica_membership.publish("app-m1", "pool", frozenset({"a"}))
    replica_membership.publish("app-m1", "other", frozenset({"x"}))  # another deployment
    unsubscribe()
    replica_membership.publish("app-m1", "pool", frozenset())
    assert seen == [frozenset({"a", "b"}), frozenset({"a"})]


def test_a_failing_listener_does_not_break_the_publisher():
    def broken(ids):
        raise RuntimeError("bug")

    seen = []
    replica_membership.subscribe("app-m2", "pool", broken)
    replica_membership.subscribe("app-m2", "pool", seen.append)
    replica_membership.publish("app-m2", "pool", frozenset({"r"}))
    assert seen == [frozenset({"r"})]


def test_the_engine_request_router_publishes_what_serve_pushes(monkeypatch):
    """``update_replicas`` / ``on_replica_actor_died`` are Serve's hooks; after Serve's own
    bookkeeping the router publishes the set it now routes to."""
    from ray.serve._private.common import DeploymentID, ReplicaID
    from ray.serve.request_router import RequestRouter

    deployment = DeploymentID(name="tt-pool", app_name="app-m3")
    ids = {name: ReplicaID(name, deployment) for name in ("r1", "r2")}
    router = PinnedReplicaRequestRouter.__new__(PinnedReplicaRequestRouter)
    router._deployment_id = deployment
    router._replicas = {}

    def serve_update(self, replicas):  # what Serve's base class keeps: id -> replica
        self._replicas = {r.replica_id: r for r in replicas}

    def serve_died(self, replica_id):
        self._replicas.pop(replica_id, None)

    monkeypatch.setattr(RequestRouter, "update_replicas", serve_update)
    monkeypatch.setattr(RequestRouter, "on_replica_actor_died", serve_died)
    seen = []
    replica_membership.subscribe("app-m3", "tt-pool", seen.append)
    router.update_replicas([SimpleNamespace(replica_id=i) for i in ids.values()])
    router.on_replica_actor_died(ids["r2"])
    assert seen == [frozenset({"r1", "r2"}), frozenset({"r1"})]


def test_router_deployment_applies_membership_on_its_loop():
    from deployments.config.router import RouterConfig
    from deployments.router.deployment import RouterDeployment
    from tests.doubles.app_configs import app_config, pool_config

    class Handle:
        app_name, deployment_name = "app-m4", "tt-pool"

    async def run():
        config = app_config([pool_config("tt", "m", "tt", "tt", "both", 16)], RouterConfig(stats_period_s=3600))
        router = RouterDeployment(config, {"tt": Handle()})
        polls = []

        async def fake_refresh():
            polls.append(1)

        router.refresh = fake_refresh
        router._ensure_poller()
        await asyncio.sleep(0)
        router.engines.replica_pool.update({"r1": "tt", "r2": "tt"})
        # Serve's router thread publishes: r2 is gone, r3 is new.
        thread = threading.Thread(
            target=replica_membership.publish, args=("app-m4", "tt-pool", frozenset({"r1", "r3"}))
        )
        thread.start()
        thread.join()
        await asyncio.sleep(0.05)
        assert set(router.engines.replica_pool) == {"r1"}  # r2 removed at once; r3 comes with the poll
        assert len(polls) >= 2  # the periodic poll's first round + one for the new replica
        router._poller.cancel()

    asyncio.run(run())
