"""The router deployment learns each replica's ``max_loras`` from its pool (``enable_lora`` in a
vLLM pool's engine args; TT pools run none), and places adapter requests on those replicas only."""

from __future__ import annotations

import asyncio
import dataclasses

from accel.block_hash import hash_prompt_blocks, salted_root
from deployments.config.router import RouterConfig
from deployments.messages.routing import RouteRequest
from deployments.router.deployment import RouterDeployment
from tests.doubles.app_configs import app_config, pool_config
from tests.doubles.router_fakes import BS, FakePoolHandle, make_snap, prompt_ids


def _lora_pool():
    pool = pool_config("lora", "m", "vllm", "cpu", "both", BS)
    extra = {"enable_lora": True, "max_loras": 3}
    return dataclasses.replace(pool, engine_config=dataclasses.replace(pool.engine_config, extra_args=extra))


def test_replicas_carry_their_pools_max_loras_and_adapter_requests_reach_only_them():
    async def run():
        pools = (pool_config("tt", "m", "tt", "cpu", "both", BS), _lora_pool())
        handles = {
            "tt": FakePoolHandle([make_snap("t1", "tt"), make_snap("t2", "tt")]),
            "lora": FakePoolHandle([make_snap("v1", "lora")]),
        }
        router = RouterDeployment(app_config(pools, RouterConfig(index_mode="precise", stats_period_s=60)), handles)
        await router.refresh()
        assert {r.replica_id: r.max_loras for r in router.logic.replicas()} == {"t1": 0, "t2": 0, "v1": 3}
        for i in range(6):
            ids = prompt_ids(8, seed=i)
            hashes = tuple(hash_prompt_blocks(ids, BS, salted_root(None, "a")))
            decision = await router.choose(RouteRequest(f"q{i}", "m", len(ids), prompt_block_hashes=hashes, lora="a"))
            assert (decision.pool, decision.replica_id) == ("lora", "v1")

    asyncio.run(run())
