"""The engine against a decode-contract version-1 generator (``HFContractGeneratorV1``: the
explicit reload commands, ``slot_remap``, ``reset_batch`` rejected; HF's logits), registered
through ``EXTRA_MODELS_DIR`` and driven on the ttnn stub. The double keeps its inputs resident
exactly as commanded, so a wrong command gives a wrong token or a ``ContractError``: greedy
output equal to HF is the end-to-end proof; the command log shows the transition table."""

from __future__ import annotations

import pytest
import torch

from accel.contract import GenerateRequest
from accel.tt.backend import open_backend
from accel.tt.config import TTEngineConfig
from accel.tt.engine import TTMeshEngine
from accel.tt.mesh_device import MeshDeviceConfig
from accel.tt.registry import build_registry
from tests.hf_reference import hf_greedy

from .conftest import CONTRACT_V1_MODELS_DIR
from .engine_harness import greedy, prompt_of, run_requests, tokens_of

pytestmark = pytest.mark.slow

COMMANDS = ("reload_inputs", "reload_page_table", "reload_sampling_params", "reset_sampling_state")


def v1_engine(ttnn, ckpt, sample_on_device_mode, **engine_args):
    ttnn._stub_simulate(8, ttnn.cluster.ClusterType.T3K)
    registry = build_registry(extra_models_dir=str(CONTRACT_V1_MODELS_DIR), include_builtins=True)
    backend = open_backend("ttnn", MeshDeviceConfig(grid=(1, 8), dispatch_core_axis="row"), registry=registry)
    tt = {"enable_model_warmup": True, "trace_mode": "all", "sample_on_device_mode": sample_on_device_mode}
    args = dict(
        model=str(ckpt),
        max_num_seqs=4,
        block_size=16,
        max_model_len=256,
        max_num_batched_tokens=256,
        async_scheduling=True,
        additional_config={"tt": tt},
    )
    return TTMeshEngine(TTEngineConfig.from_engine_args(args | engine_args), backend=backend, keep_step_log=True)


def decode_calls(model) -> list[dict]:
    return [kw for name, kw in model.calls if name == "decode"]


@pytest.mark.parametrize("sample_on_device_mode", [None, "all"])
def test_v1_generator_greedy_equals_hf_with_the_transition_tables_commands(
    ttnn_stub, tiny_llama, sample_on_device_mode
):
    engine = v1_engine(ttnn_stub, tiny_llama, sample_on_device_mode)
    try:
        model = engine.model._model
        assert type(model).__name__ == "HFContractGeneratorV1"
        # staggered joins and leaves (different lengths), a shared prompt for a prefix hit later
        prompts = {f"r{i}": prompt_of(i, 9 + 7 * i) for i in range(3)}
        reqs = [GenerateRequest(r, p, greedy(24 + 4 * i)) for i, (r, p) in enumerate(prompts.items())]
        out = run_requests(engine, reqs, 0.05)
        hit = run_requests(engine, [GenerateRequest("hit", prompts["r2"], greedy(8))])
        for r in reqs:
            assert tokens_of(out[r.request_id]) == hf_greedy(tiny_llama, r.prompt_token_ids, r.sampling.max_tokens)
        assert tokens_of(hit["hit"]) == hf_greedy(tiny_llama, prompts["r2"], 8)
        assert hit["hit"][-1].num_cached_tokens > 0
        assert model.calls[0][0] == "allocate_kv_cache_per_layer"
        steps = decode_calls(model)
        width = engine.config.max_num_seqs_global
        for kw in steps:
            assert all(isinstance(kw[c], bool) for c in COMMANDS)
            assert not (kw["reload_inputs"] and kw["reload_page_table"])  # never both
            assert kw["reload_inputs"] or not kw["reset_sampling_state"]  # reset only with inputs
            assert list(kw["slot_remap"]) == list(range(width))  # every decode, identity per slot
        served = [kw for kw in steps if kw["sampling_params"] is not None]
        if sample_on_device_mode is None:
            assert served == [] and all(kw["reload_inputs"] for kw in steps)  # steady host: full reload
            assert not any(kw["reload_sampling_params"] or kw["reset_sampling_state"] for kw in steps)
        else:
            resident = [kw for kw in served if not kw["reload_inputs"]]
            assert len(resident) > len(served) // 2  # steady device decode keeps inputs resident
            assert any(kw["reload_page_table"] for kw in resident)  # a row crossed a block: tables only
            assert any(not kw["reload_page_table"] for kw in resident)
            first = served[0]
            assert (first["reload_inputs"], first["reload_sampling_params"], first["reset_sampling_state"]) == (
                True,
                True,
                True,
            )
            assert engine.core.queue.num_overlapped_steps > 0
    finally:
        engine.close()


def test_v1_generator_preemption_equals_hf(ttnn_stub, tiny_llama):
    engine = v1_engine(
        ttnn_stub, tiny_llama, "all", block_size=8, max_model_len=128, num_gpu_blocks_override=20, max_num_seqs=4
    )
    try:
        reqs = [GenerateRequest(f"p{i}", prompt_of(i, 20 + (i * 13) % 40), greedy(24)) for i in range(8)]
        out = run_requests(engine, reqs, 0.002)
        for r in reqs:
            assert tokens_of(out[r.request_id]) == hf_greedy(tiny_llama, r.prompt_token_ids, 24), r.request_id
        assert any(rec.preempted_req_ids for rec in engine.step_log)
    finally:
        engine.close()


def test_v1_generator_rejects_reset_batch_and_forbidden_pairs(ttnn_stub, tiny_llama):
    from transformers import AutoConfig

    cls = build_registry(extra_models_dir=str(CONTRACT_V1_MODELS_DIR), include_builtins=False).resolve(
        AutoConfig.from_pretrained(tiny_llama), "ttnn"
    )
    model = object.__new__(cls)
    model.calls, model.max_batch_size, model.data_parallel = [], 2, 1
    base = dict(
        tokens=torch.zeros(2, 1, dtype=torch.int64),
        start_pos=torch.full((2,), -1, dtype=torch.int32),
        page_table=torch.zeros(2, 4, dtype=torch.int32),
        kv_cache=None,
        enable_trace=True,
        read_from_device=False,
        slot_remap=[0, 1],
    )
    with pytest.raises(TypeError, match="reload_inputs"):  # the commands are required
        model.decode_forward(**base)
    commands = dict(reload_inputs=True, reload_page_table=False, reload_sampling_params=False)
    with pytest.raises(ValueError, match="reset_batch"):
        model.decode_forward(**base, **commands, reset_sampling_state=False, reset_batch=True)
    with pytest.raises(ValueError, match="both true"):
        model.decode_forward(**base, **(commands | {"reload_page_table": True}), reset_sampling_state=False)
