"""End to end prefill/decode disaggregation on a real (small) Ray Serve: a TT prefill pool (torch
mesh model) and a vLLM-CPU decode pool. Long prompts go prefill (TT) -> KV-connector actor ->
decode (vLLM, whose MeshServeConnector runs in vLLM's child processes and joins the cluster);
greedy output equals HF transformers token for token, and the actor saw the transfer."""

from __future__ import annotations

import openai
import pytest

from tests.doubles.app_args import app_args, tt_pool, vllm_pool
from tests.doubles.deployed_app import deployed_app
from tests.hf_reference import hf_greedy

pytestmark = pytest.mark.slow

APP = "meshserve-pd"


@pytest.fixture(scope="module")
def client(serve_session, tiny_llama):
    pools = [tt_pool("tt-prefill", role="prefill"), vllm_pool("vllm-decode", role="decode", enable_prefix_caching=True)]
    args = app_args("test_pd_e2e", tiny_llama, pools, pd={"threshold_tokens": 64})
    try:
        with deployed_app(serve_session, APP, args, "/pd", engine_replicas=2) as url:
            yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    finally:
        from deployments.kv.connector_actor import kill_kv_connector

        kill_kv_connector(APP)


def _actor_stats():

    from deployments.kv.connector_actor import get_kv_connector

    return get_kv_connector(APP).stats()["registry"]


def _prompt(n, seed):
    return [3 + (seed * 31 + i * 17) % 1000 for i in range(n)]


def test_long_prompt_is_disaggregated_and_exact(client, tiny_llama):
    prompt = _prompt(150, 1)
    before = _actor_stats()["num_completed"]
    out = client.completions.create(
        model="tiny-llama",
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    assert out.choices[0].model_extra["token_ids"] == hf_greedy(tiny_llama, prompt, 12)
    stats = _actor_stats()
    assert stats["num_completed"] == before + 1, "the decode replica did not import the prefill's KV"
    assert stats["recomputes"] == {}
    assert out.usage.prompt_tokens_details.cached_tokens == 150  # vLLM counts connector-loaded tokens as cached


def test_streamed_long_prompt_and_short_prompt_are_exact(client, tiny_llama):
    long, short = _prompt(100, 2), _prompt(20, 3)
    stream = client.completions.create(
        model="tiny-llama",
        prompt=long,
        max_tokens=10,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    ids = [t for chunk in stream for c in chunk.choices for t in (c.model_extra.get("token_ids") or [])]
    assert ids == hf_greedy(tiny_llama, long, 10)
    before = _actor_stats()["num_completed"]
    out = client.completions.create(
        model="tiny-llama",
        prompt=short,
        max_tokens=10,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    assert out.choices[0].model_extra["token_ids"] == hf_greedy(tiny_llama, short, 10)
    assert _actor_stats()["num_completed"] == before  # short: decode pool prefilled it locally
