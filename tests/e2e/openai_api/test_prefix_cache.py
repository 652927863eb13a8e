"""End to end: prefix caching seen from outside — ``cached_tokens`` in the usage, and the vLLM
replica's block report to the router (vLLM's own KV events)."""

from __future__ import annotations

import time

import pytest

from tests.doubles.app_args import pin
from tests.doubles.handle_loop import HANDLES
from tests.e2e.openai_api.local_app import APP, POOLS

pytestmark = pytest.mark.slow


def test_cached_tokens_reported(client):
    prompt = [0] + [(7 * i) % 900 + 3 for i in range(299)]
    kw = dict(model="tiny-llama", prompt=prompt, max_tokens=2, temperature=0, extra_headers=pin("vllm"))
    client.completions.create(**kw)
    again = client.completions.create(**kw)
    assert again.usage.prompt_tokens_details.cached_tokens >= 128  # vLLM-CPU: full 32-token blocks (tiny.yaml)


async def _vllm_routing_snapshots():
    from ray import serve

    handle = serve.get_deployment_handle(POOLS["vllm"], APP)
    return await handle.broadcast("routing_snapshot", {}).results_async(timeout_s=30)


def test_vllm_replica_reports_its_blocks_to_the_router(client):
    """The vLLM replica follows vLLM's ZMQ KV events inside Serve: its poll answer without a cursor is a
    block snapshot with the prompt's full-block hashes at the routing block size (32 here)."""
    from accel.block_hash import hash_prompt_blocks

    prompt = [0] + [(11 * i) % 900 + 3 for i in range(140)]
    client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=2, temperature=0, extra_headers=pin("vllm"))
    want = set(hash_prompt_blocks(prompt, 32))
    deadline = time.monotonic() + 10
    while True:
        (snap,) = HANDLES.submit(_vllm_routing_snapshots()).result(timeout=60)
        assert snap.publishes_kv_events and snap.block_size == 32
        if want <= set(snap.kv_blocks) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert want <= set(snap.kv_blocks)
