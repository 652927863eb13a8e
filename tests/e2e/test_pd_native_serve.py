"""Native-connector prefill/decode through the whole application on a real (small) Ray Serve: two
vLLM-CPU pools whose engine_args configure their own connector (``MeshServeConnector`` standing in
for ``TPUConnector``: producer on the prefill pool, consumer on the decode pool), so the router
pairs them by KV path and the replicas pass the engine's own ``kv_transfer_params`` through the
KV-connector actor. Long prompts are disaggregated and equal HF and colocated serving token for
token; an expired params lease makes the decode pool recompute and still complete."""

from __future__ import annotations

import time

import openai
import pytest

from accel.contract import GenerateRequest, SamplingParams, join_token_ids
from tests.doubles.app_args import app_args, vllm_pool
from tests.doubles.deployed_app import deployed_app
from tests.doubles.handle_loop import HANDLES
from tests.hf_reference import hf_greedy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

APP = "meshserve-pd-native"
LEASE_S = 4.0


def _connector(role):
    return {
        "kv_connector": "MeshServeConnector",
        "kv_connector_module_path": "accel.vllm.kv_connector",
        "kv_role": role,
        "kv_load_failure_policy": "recompute",
    }


@pytest.fixture(scope="module")
def client(serve_session, tiny_llama):
    from deployments.kv.connector_actor import KVConnectorConfig, get_or_create_kv_connector, kill_kv_connector

    get_or_create_kv_connector(APP, KVConnectorConfig(lease_s=LEASE_S))  # before the replicas ask for it
    pools = [
        # No prefix caching: only the connector can import.
        vllm_pool("pre", role="prefill", enable_prefix_caching=False, kv_transfer_config=_connector("kv_producer")),
        vllm_pool("dec", role="decode", enable_prefix_caching=False, kv_transfer_config=_connector("kv_consumer")),
    ]
    args = app_args("test_pd_native_serve_e2e", tiny_llama, pools, pd={"threshold_tokens": 64})
    try:
        with deployed_app(serve_session, APP, args, "/pdn", engine_replicas=2) as url:
            yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    finally:
        kill_kv_connector(APP)


def _stats():

    from deployments.kv.connector_actor import get_kv_connector

    return get_kv_connector(APP).stats()["registry"]


def _prompt(n, seed):
    return [3 + (seed * 31 + i * 17) % 1000 for i in range(n)]


def _complete(client, prompt, max_tokens, **headers):
    out = client.completions.create(
        model="tiny-llama",
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
        extra_headers=headers or None,
    )
    return out.choices[0].model_extra["token_ids"]


def test_long_prompt_goes_through_the_native_hand_off_and_is_exact(client, tiny_llama):
    prompt = _prompt(150, 1)
    before = _stats()
    ids = _complete(client, prompt, 12)
    assert ids == hf_greedy(tiny_llama, prompt, 12)
    after = _stats()
    assert after["num_params_claimed"] == before["num_params_claimed"] + 1, "not disaggregated natively"
    assert after["num_completed"] == before["num_completed"] + 1, "the decode engine's connector did not import"
    assert after["recomputes"] == before["recomputes"] and after["num_params"] == 0
    # colocated: pinned to the decode pool, no PD
    assert _complete(client, prompt, 12, **{"x-meshserve-pool": "dec"}) == ids
    assert _stats()["num_params_claimed"] == after["num_params_claimed"]


def test_expired_params_lease_recomputes_on_the_decode_pool(client, tiny_llama):
    from ray import serve

    from accel.kv_transfer.params import new_transfer_id
    from deployments.pd.orchestrator import prefill_request

    request = GenerateRequest(
        "exp-1", tuple(_prompt(96, 2)), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    )

    async def run(pool, req):
        handle = serve.get_deployment_handle(f"VllmReplica-{pool}", APP).options(stream=True)
        return [d async for d in handle.generate.remote(req)]

    ticket = HANDLES.call(run("pre", prefill_request(request, new_transfer_id("exp-1"))))[-1].kv_transfer
    assert ticket is not None and ticket.do_remote_prefill and ticket.connector_params is None
    before = _stats()
    deadline = time.monotonic() + LEASE_S + 10
    while _stats()["num_params"] and time.monotonic() < deadline:
        time.sleep(0.5)
    out = HANDLES.call(
        run("dec", GenerateRequest("exp-1", request.prompt_token_ids, request.sampling, kv_transfer=ticket))
    )
    assert join_token_ids(out) == hf_greedy(tiny_llama, list(request.prompt_token_ids), 8)
    after = _stats()
    assert after["recomputes"].get("params_missing", 0) == before["recomputes"].get("params_missing", 0) + 1
    assert after["num_expired"] >= before["num_expired"] + 1
