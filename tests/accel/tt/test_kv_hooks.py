"""TT -> TT prefill/decode through the real KV-connector actor with the torch mesh model:
token-exact against HF and colocated serving; failures recompute."""

from __future__ import annotations

import random

import pytest
import torch

from accel.contract import GenerateRequest, KVTransferParams, join_token_ids
from accel.tt.step_plan import StepMode
from tests.accel.tt.engine_harness import greedy, make_engine, run_requests
from tests.hf_reference import hf_greedy, hf_prompt_kv

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray")

APP = "tt-kv-test"


@pytest.fixture(scope="module")
def transport():
    from deployments.kv.connector_actor import get_or_create_kv_connector, kill_kv_connector
    from deployments.kv.ray_transport import RayKVTransport

    ray.init(address="local", num_cpus=1, object_store_memory=100 << 20, include_dashboard=False, log_to_driver=False)
    get_or_create_kv_connector(APP)
    yield RayKVTransport(APP)
    kill_kv_connector(APP)
    ray.shutdown()


def _engine(tiny_llama, transport, **args):
    from accel.tt.engine import TTMeshEngine
    from accel.tt.kv_hooks import KVTransferHooks
    from accel.tt.torch_model import TorchMeshModel

    engine = make_engine(
        tiny_llama,
        model_class=TorchMeshModel,
        tt={"enable_model_warmup": False},
        data_parallel_size=2,
        max_num_seqs=2,
        **args,
    )
    # make_engine builds without hooks; rebuild the same config with them attached.
    config = engine.config
    engine.close()
    return TTMeshEngine(
        config, model_class=TorchMeshModel, keep_step_log=True, kv_hooks=KVTransferHooks(transport, str(tiny_llama))
    )


@pytest.fixture(scope="module")
def engines(tiny_llama, transport):
    prefill = _engine(tiny_llama, transport)
    decode = _engine(tiny_llama, transport, block_size=32)  # another block size than the producer's
    yield prefill, decode
    prefill.close()
    decode.close()


def _prompt(seed, n):
    rng = random.Random(seed)
    return tuple(rng.randrange(3, 1024) for _ in range(n))


def _stats():
    from deployments.kv.connector_actor import get_kv_connector

    return get_kv_connector(APP).stats()["registry"]


def _pd(prefill, decode, rid, prompt, max_tokens=10):
    pre = run_requests(
        prefill, [GenerateRequest(f"{rid}-p", prompt, greedy(1), kv_transfer=KVTransferParams(do_remote_decode=True))]
    )[f"{rid}-p"]
    ticket = pre[-1].kv_transfer
    out = run_requests(decode, [GenerateRequest(f"{rid}-d", prompt, greedy(max_tokens), kv_transfer=ticket)])
    return ticket, out[f"{rid}-d"]


@pytest.mark.parametrize("num_tokens", [1, 2, 20, 64, 101])  # 1-2: short prompts go PD while decode is busy
def test_tt_to_tt_equals_hf_and_colocated(engines, tiny_llama, num_tokens):
    prefill, decode = engines
    prompt = _prompt(num_tokens, num_tokens)
    before = _stats()["num_completed"]
    ticket, out = _pd(prefill, decode, f"r{num_tokens}", prompt)
    assert ticket is not None and ticket.do_remote_prefill and ticket.num_tokens == num_tokens
    expected = hf_greedy(tiny_llama, prompt, 10)
    assert join_token_ids(out) == expected
    colocated = run_requests(prefill, [GenerateRequest(f"c{num_tokens}", prompt, greedy(10))])[f"c{num_tokens}"]
    assert join_token_ids(colocated) == expected
    assert _stats()["num_completed"] == before + 1
    # The decode engine (its own block size, 32) took every imported token as cached — full
    # blocks from its prefix cache, the partial tail preloaded — and never ran a prefill step for
    # the request: its last prompt token was the input of its first decode step.
    assert out[-1].num_cached_tokens == num_tokens - 1
    steps = [
        rec.mode for rec in decode.step_log for lane in rec.lane_rows for row in lane if row[0] == f"r{num_tokens}-d"
    ]
    assert steps and set(steps) == {StepMode.DECODE}


def test_payload_is_exactly_the_prefill_kv(engines, transport, tiny_llama):
    """The exported payload is the prompt's KV as HF transformers computes it (an independent
    reference: K after RoPE, per layer, in the canonical [L, 2, T, Hkv, D] layout)."""
    prefill, _ = engines
    prompt = _prompt(5, 40)
    pre = run_requests(
        prefill,
        [
            GenerateRequest(
                "x-p", prompt, greedy(1), kv_transfer=KVTransferParams(do_remote_decode=True, transfer_id="exact")
            )
        ],
    )["x-p"]
    assert pre[-1].kv_transfer.transfer_id == "exact"
    payload = transport.fetch("exact", 5)
    payload.descriptor.check_prompt(prompt)
    assert payload.kv.shape == (4, 2, 40, 2, 32) and payload.kv.dtype == torch.float32
    reference = hf_prompt_kv(tiny_llama, prompt)
    assert torch.allclose(payload.kv, reference, atol=1e-4, rtol=1e-4), (
        f"max |engine - HF| = {(payload.kv - reference).abs().max():.3g}"
    )
    # A second export of the same prompt (served from the prefix cache) carries identical KV.
    run_requests(
        prefill,
        [
            GenerateRequest(
                "y-p", prompt, greedy(1), kv_transfer=KVTransferParams(do_remote_decode=True, transfer_id="exact2")
            )
        ],
    )
    assert torch.equal(transport.fetch("exact2", 5).kv[:, :, :32], payload.kv[:, :, :32])
    transport.complete("exact")
    transport.complete("exact2")


def test_missing_and_mismatched_transfers_recompute(engines, tiny_llama, transport):
    from accel.kv_transfer.payload import KVDescriptor, KVPayload

    _, decode = engines
    prompt = _prompt(9, 70)
    expected = hf_greedy(tiny_llama, prompt, 8)
    missing = KVTransferParams(do_remote_prefill=True, transfer_id="nope", num_tokens=70)
    out = run_requests(decode, [GenerateRequest("m", prompt, greedy(8), kv_transfer=missing)])["m"]
    assert join_token_ids(out) == expected and out[-1].num_cached_tokens == 0
    prompt = _prompt(10, 70)  # a fresh prompt: the first one is in the decode replica's cache now
    desc = KVDescriptor.for_prompt("other-model", torch.float32, 4, 2, 32, prompt, 16)
    transport.put("foreign", KVPayload(desc, torch.randn(desc.shape)), 5)
    foreign = KVTransferParams(do_remote_prefill=True, transfer_id="foreign", num_tokens=70)
    out = run_requests(decode, [GenerateRequest("f", prompt, greedy(8), kv_transfer=foreign)])["f"]
    assert join_token_ids(out) == hf_greedy(tiny_llama, prompt, 8) and out[-1].num_cached_tokens == 0
    recomputes = _stats()["recomputes"]
    assert recomputes.get("KVTransferNotFound", 0) >= 1 and recomputes.get("KVModelMismatchError", 0) == 1


def _orchestrated(prefill, decode, rid, prompt, max_tokens=10):
    import asyncio

    from deployments.pd.orchestrator import PDOrchestrator

    orch = PDOrchestrator(metrics=False)

    async def go():
        return [
            d
            async for d in orch.stream(
                GenerateRequest(rid, prompt, greedy(max_tokens)), prefill.generate, decode.generate
            )
        ]

    return orch, asyncio.run(go())


def test_orchestrated_pd_equals_hf(engines, tiny_llama):
    prefill, decode = engines
    prompt = _prompt(77, 90)
    before = _stats()["num_completed"]
    orch, out = _orchestrated(prefill, decode, "o1", prompt)
    assert join_token_ids(out) == hf_greedy(tiny_llama, prompt, 10)
    assert orch.num_recomputes == {} and _stats()["num_completed"] == before + 1
    assert out[-1].num_cached_tokens == 89  # every prompt token but the last imported


def test_actor_killed_mid_transfer_request_completes(engines, tiny_llama):
    """Last in the module: the actor dies between requests' transfers. Same-node transfers live in
    the node's shared-memory store, not in the actor, so the hand-off still works (strictly better
    than recomputing); a ticket whose payload is gone makes the decode engine recompute."""
    from deployments.kv.connector_actor import get_kv_connector, get_or_create_kv_connector, kill_kv_connector

    prefill, decode = engines
    prompt = _prompt(78, 90)
    ray.kill(get_kv_connector(APP).handle)
    orch, out = _orchestrated(prefill, decode, "o2", prompt)
    assert join_token_ids(out) == hf_greedy(tiny_llama, prompt, 10)
    assert orch.num_recomputes == {} and out[-1].num_cached_tokens == 89
    # A ticket whose payload died with the application's store: the decode engine recomputes.
    get_or_create_kv_connector(APP)
    ticket, _ = _pd(prefill, decode, "o3", _prompt(79, 90))
    kill_kv_connector(APP)
    prompt = _prompt(79, 90)
    imported_before = decode.core.kv_hooks.num_imported_tokens
    out = run_requests(decode, [GenerateRequest("o4", prompt, greedy(10), kv_transfer=ticket)])["o4"]
    assert join_token_ids(out) == hf_greedy(tiny_llama, prompt, 10)
    assert decode.core.kv_hooks.num_imported_tokens == imported_before  # nothing came from the gone store
    get_or_create_kv_connector(APP)  # for the module teardown


def test_prefix_tier_lets_another_replica_reuse_a_prefix(tiny_llama, transport):
    """Replica A serves a prompt and offers its full blocks to the actor's prefix tier; replica B,
    which never saw it, imports them for a prompt sharing that prefix: exact output, cached tokens."""
    from accel.tt.engine import TTMeshEngine
    from accel.tt.kv_hooks import KVTransferHooks
    from accel.tt.torch_model import TorchMeshModel
    from deployments.kv.connector_actor import KVConnectorConfig, get_or_create_kv_connector, kill_kv_connector
    from deployments.kv.ray_transport import RayKVTransport

    app = "tt-prefix-tier"  # (Ray is up: the module's transport fixture)
    engines = []
    try:
        get_or_create_kv_connector(app, KVConnectorConfig(prefix_tier_bytes=16 << 20))
        template = make_engine(
            tiny_llama,
            model_class=TorchMeshModel,
            tt={"enable_model_warmup": False},
            data_parallel_size=1,
            max_num_seqs=2,
        )
        config = template.config
        template.close()
        for _ in range(2):
            hooks = KVTransferHooks(RayKVTransport(app), str(tiny_llama), share_prefixes=True)
            engines.append(TTMeshEngine(config, model_class=TorchMeshModel, kv_hooks=hooks))
        a, b = engines
        shared = _prompt(500, 80)
        run_requests(a, [GenerateRequest("a1", shared, greedy(4))])
        prompt = shared + _prompt(501, 10)
        out = run_requests(b, [GenerateRequest("b1", prompt, greedy(8))])["b1"]
        assert join_token_ids(out) == hf_greedy(tiny_llama, prompt, 8)
        assert out[-1].num_cached_tokens == 80  # 5 blocks of 16 from the tier
        assert b.core.kv_hooks.num_tier_tokens == 80
        tier = ray.get(ray.get_actor("kv_connector", namespace=f"meshserve-kv-{app}").stats.remote())["prefix_tier"]
        assert tier["num_blocks"] >= 5 and tier["num_hits"] >= 5
    finally:
        for e in engines:
            e.close()
        kill_kv_connector(app)
