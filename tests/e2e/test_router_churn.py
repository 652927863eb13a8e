"""End to end on a real (small) Ray Serve: the router hears of engine-replica churn from Serve at
once, not at its next poll. The router polls only every 10 minutes here, so only Serve's pushed
running-replica sets (``deployments/handle_routing/replica_membership.py``) can explain the changes seen."""

from __future__ import annotations

import time

import pytest

from tests.doubles.app_args import app_args, tt_pool
from tests.doubles.deployed_app import deployed_app
from tests.doubles.handle_loop import HANDLES

pytestmark = pytest.mark.slow

APP = "router-churn-e2e"
POOL = "TTMeshReplica-tt"


def _args(tiny_llama) -> dict:
    pool = tt_pool(replicas=2, max_model_len=256, max_num_seqs=2)
    return app_args("test_router_churn_e2e", tiny_llama, [pool], router={"stats_period_s": 600})


async def _router_replicas() -> set[str]:
    from ray import serve

    from serve_app.app import ROUTER_NAME

    snap = await serve.get_deployment_handle(ROUTER_NAME, APP).snapshot.remote()
    return {view.replica_id for view in snap.replicas}


def _wait_for(predicate, timeout_s: float = 60.0) -> set[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        known = HANDLES.call(_router_replicas())
        if predicate(known):
            return known
        assert time.monotonic() < deadline, f"router still knows {known}"
        time.sleep(0.2)


def test_a_killed_engine_replica_leaves_and_its_replacement_joins_at_once(serve_session, tiny_llama):
    import ray
    from ray.serve._private.common import DeploymentID, ReplicaID

    with deployed_app(serve_session, APP, _args(tiny_llama), engine_replicas=2):
        before = HANDLES.call(_router_replicas())
        victim = sorted(before)[0]
        full_name = ReplicaID(victim, DeploymentID(name=POOL, app_name=APP)).to_full_id_str()
        ray.kill(ray.get_actor(full_name, namespace="serve"), no_restart=True)
        # Serve notices the death, starts a replacement and pushes both changes to the router's
        # handle; the router's own next poll is 10 minutes away.
        after = _wait_for(lambda known: victim not in known and len(known) == 2)
        assert len(after - before) == 1
