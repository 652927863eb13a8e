"""The real default model (SmolLM2-135M-Instruct) across engines and faults, on a real (small)
Ray Serve: prefill on a TT pool and decode on a vLLM-CPU pool (the KV moves through the
KV-connector actor, converted between the engines' layouts), and a stream whose engine replica
is killed mid-answer, continued on the other replica. Greedy output equals HF transformers token
for token in both.
"""

from __future__ import annotations

import openai
import pytest
from transformers import AutoTokenizer

from tests.doubles.app_args import app_args, tt_pool, vllm_pool
from tests.doubles.deployed_app import deployed_app
from tests.doubles.replica_kill import kill_busy_replica, stream_failovers, wait_pool_size
from tests.hf_reference import greedy_divergence, hf_greedy

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"  # the served name app_args gives the one model (the checkpoint is SmolLM2's)
LONG_CONTEXT = {"max_model_len": 1024}
SYSTEM = (
    "You are a careful assistant for a railway company. Answer questions about timetables, tickets, "
    "luggage, accessibility, bicycles, pets and delays. Be brief, polite and exact. If you do not know, "
    "say so and point to the help desk at the main station, open from six in the morning to ten at night."
)


@pytest.fixture(scope="module")
def prompt(smollm2) -> list[int]:
    """A real chat prompt of ~100 tokens (over the PD threshold below)."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Can I bring my bicycle?"}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)


def _completion(client, prompt, max_tokens, **kw):
    return client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
        **kw,
    )


def test_prefill_on_tt_decode_on_vllm(serve_session, smollm2, prompt):
    app = "real-model-pd"
    pools = [
        tt_pool("tt-prefill", role="prefill", block_size=32, **LONG_CONTEXT),
        vllm_pool("vllm-decode", role="decode", enable_prefix_caching=True, **LONG_CONTEXT),
    ]
    args = app_args("test_real_model_pd", smollm2, pools, pd={"threshold_tokens": 64})
    from deployments.kv.connector_actor import get_kv_connector, kill_kv_connector

    try:
        with deployed_app(serve_session, app, args, "/real-pd", engine_replicas=2, timeout_s=300) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
            before = get_kv_connector(app).stats()["registry"]["num_completed"]
            out = _completion(client, prompt, 24)
            tokens = out.choices[0].model_extra["token_ids"]
            assert tokens == hf_greedy(smollm2, prompt, 24), greedy_divergence(smollm2, prompt, tokens)
            stats = get_kv_connector(app).stats()["registry"]
            assert stats["num_completed"] == before + 1, "the decode replica did not import the prefill's KV"
            assert stats["recomputes"] == {}
            assert out.usage.prompt_tokens_details.cached_tokens == len(prompt)  # loaded, not recomputed
    finally:
        kill_kv_connector(app)


@pytest.mark.parametrize("engine", ["tt", "vllm"])
def test_a_stream_survives_its_replica(serve_session, smollm2, prompt, engine):
    app, max_tokens = f"real-model-failover-{engine}", 160
    pool = (tt_pool if engine == "tt" else vllm_pool)(engine, replicas=2, block_size=32, **LONG_CONTEXT)
    deployment = "TTMeshReplica-tt" if engine == "tt" else "VllmReplica-vllm"
    args = app_args("test_real_model_failover", smollm2, [pool], router={"stats_period_s": 0.5})
    with deployed_app(serve_session, app, args, f"/{app}", engine_replicas=2, timeout_s=300) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        tokens: list[int] = []
        killed = False
        before = stream_failovers(url, MODEL)
        stream = _completion(client, prompt, max_tokens, stream=True, stream_options={"include_usage": True})
        usage = None
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                tokens.extend(choice.model_extra.get("token_ids") or [])
            if tokens and not killed:
                kill_busy_replica(app, deployment)
                killed = True
        assert killed and stream_failovers(url, MODEL) == before + 1  # it did fail over, once
        assert len(tokens) == max_tokens
        assert tokens == hf_greedy(smollm2, prompt, max_tokens), greedy_divergence(smollm2, prompt, tokens)
        assert usage.prompt_tokens == len(prompt) and usage.completion_tokens == max_tokens
        wait_pool_size(app, deployment, 2)  # Serve replaces the dead replica
