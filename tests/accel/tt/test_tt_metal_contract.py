"""The engine against a model class with tt-metal's real call contract (``HFContractGenerator``:
tt-metal's signatures and return conventions, HF transformers' logits), registered through
``EXTRA_MODELS_DIR`` + ``vllm_metadata.json`` and driven on the ttnn stub: greedy output equals
HF token for token, with host and device sampling, warmup and async decode on. The second half
shows that each way our old contract differed from tt-metal's now fails loudly."""

from __future__ import annotations

import pytest
import torch

from accel.contract import GenerateRequest, KVTransferParams
from accel.tt.backend import open_backend
from accel.tt.config import TTEngineConfig
from accel.tt.engine import TTMeshEngine
from accel.tt.mesh_device import MeshDeviceConfig
from accel.tt.model_output import unpack_output
from accel.tt.registry import build_registry
from tests.hf_reference import hf_greedy

from .conftest import CONTRACT_MODELS_DIR
from .engine_harness import greedy, prompt_of, run_requests, tokens_of

pytestmark = pytest.mark.slow

NUM_NEW = 6
READ_BACK = ("read_decode_output", "process_decode_output_host")


def contract_engine(ttnn, ckpt, sample_on_device_mode, kv_hooks=None, **engine_args):
    ttnn._stub_simulate(8, ttnn.cluster.ClusterType.T3K)
    registry = build_registry(extra_models_dir=str(CONTRACT_MODELS_DIR), include_builtins=True)
    backend = open_backend("ttnn", MeshDeviceConfig(grid=(1, 8), dispatch_core_axis="row"), registry=registry)
    tt = {"enable_model_warmup": True, "trace_mode": "all"}
    if sample_on_device_mode is not None:
        tt["sample_on_device_mode"] = sample_on_device_mode
    config = TTEngineConfig.from_engine_args(
        dict(
            model=str(ckpt),
            max_num_seqs=4,
            block_size=32,
            max_model_len=256,
            max_num_batched_tokens=256,
            async_scheduling=True,
            additional_config={"tt": tt},
        )
        | engine_args
    )
    return TTMeshEngine(config, backend=backend, kv_hooks=kv_hooks)


@pytest.mark.parametrize("checkpoint", ["tiny_llama", "tiny_qwen3"])
@pytest.mark.parametrize("sample_on_device_mode", [None, "all"])
def test_greedy_equals_hf_through_tt_metals_contract(ttnn_stub, request, checkpoint, sample_on_device_mode):
    ckpt = request.getfixturevalue(checkpoint)
    engine = contract_engine(ttnn_stub, ckpt, sample_on_device_mode)
    try:
        model = engine.model._model
        assert type(model).__name__ == "HFContractGenerator"
        prompts = {f"r{i}": prompt_of(i, 9 + 7 * i) for i in range(3)}
        out = run_requests(engine, [GenerateRequest(r, p, greedy(NUM_NEW)) for r, p in prompts.items()], 0.05)
        for req_id, prompt in prompts.items():
            assert tokens_of(out[req_id]) == hf_greedy(ckpt, prompt, NUM_NEW), req_id
        names = [name for name, _ in model.calls if name not in READ_BACK]
        # warmup: compile then capture, by keyword (the double's signatures take kv_cache first)
        assert names[:5] == [
            "allocate_kv_cache",  # the pinned revision has no per-layer allocator
            "warmup_prefill",
            "warmup_decode",
            "decode",
            "warmup_prefill",
        ]
        assert model.calls[0][1]["dtype"] is torch.float32
        legacy = [kw for name, kw in model.calls if name == "decode" and kw["sampling_params"] is not None]
        assert all(isinstance(kw["reset_batch"], bool) for kw in legacy)  # version 0: reset_batch
        assert all(kw["extra"] == [] for name, kw in model.calls if name == "decode")  # and no commands
        assert type(model).max_tokens_calls[-1]["num_devices"] == 8  # the mesh's physical devices
        device_params = [kw["sampling_params"] for name, kw in model.calls if name in ("decode", "prefill")]
        device_params = [p for p in device_params if p is not None]
        if sample_on_device_mode is None:
            assert device_params == []
        else:
            assert device_params, "device sampling never ran"
            assert all(s is None for p in device_params for s in p.seed)  # unseeded: None, not -1
            assert all(e is False for p in device_params for e in p.enable_log_probs)
            assert engine.core.queue.num_overlapped_steps > 0  # async decode really overlapped
    finally:
        engine.close()


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_read_back_paths_are_the_plugins(ttnn_stub, tiny_llama, async_scheduling):
    """Async decode: ``read_decode_output(async_read=True)`` then ``process_decode_output_host`` on
    the host copy. Synchronous (no async scheduling): ``process_decode_output_host`` straight on
    the device output, no ``read_decode_output`` (plugin e3fc849 ``model_runner`` /
    ``async_decode.finalize_decode``)."""
    engine = contract_engine(ttnn_stub, tiny_llama, "all", async_scheduling=async_scheduling)
    try:
        model = engine.model._model
        first_serving = len(model.calls)
        prompt = prompt_of(1, 12)
        out = run_requests(engine, [GenerateRequest("r", prompt, greedy(NUM_NEW))])
        assert tokens_of(out["r"]) == hf_greedy(tiny_llama, prompt, NUM_NEW)
        serving = model.calls[first_serving:]
        reads = [kw for name, kw in serving if name == "read_decode_output"]
        processed = [kw["on_device"] for name, kw in serving if name == "process_decode_output_host"]
        assert processed, "no decode was read back"
        if async_scheduling:
            assert reads and all(kw["async_read"] for kw in reads) and not any(processed)
        else:
            assert reads == [] and all(processed)
    finally:
        engine.close()


def test_device_penalties_read_the_token_histories_and_match_the_host(ttnn_stub, tiny_llama):
    """The class declares no ``supports_device_penalties`` (the plugin's default: True): penalized
    decodes sample on the device with ``prompt_tokens`` / ``output_tokens`` (-1 padded), and
    give the host sampler's tokens; the prefill's token samples on the host."""
    prompt = (5,) * 30  # unpenalized, the tiny model's greedy output repeats a token within 12
    sampling = greedy(12, repetition_penalty=1.2, frequency_penalty=2.0, presence_penalty=2.0)
    outs = {}
    for mode in (None, "all"):
        engine = contract_engine(ttnn_stub, tiny_llama, mode)
        try:
            outs[mode] = tokens_of(run_requests(engine, [GenerateRequest("r", prompt, sampling)])["r"])
            decodes = [kw for name, kw in engine.model._model.calls if name == "decode" and kw["sampling_params"]]
        finally:
            engine.close()
    assert outs["all"] == outs[None]
    assert outs[None] != hf_greedy(tiny_llama, prompt, 12)  # the penalties change this output
    assert decodes and all(kw["sampling_params"].repetition_penalty[0] == 1.2 for kw in decodes)
    assert all(kw["histories"] for kw in decodes)


def test_device_logprobs_of_the_sampled_token_on_an_eight_device_mesh(ttnn_stub, tiny_llama):
    """Plugin e3fc849: on an 8- or 32-device mesh, ``logprobs=0`` samples on the device, whose
    ``(tokens, log_probs)`` give each token's log prob; wider requests stay on the host (only
    gpt_oss returns the top-32 pair)."""
    from transformers import AutoModelForCausalLM

    prompt = prompt_of(3, 11)
    engine = contract_engine(ttnn_stub, tiny_llama, "all")
    try:
        out = run_requests(engine, [GenerateRequest("r", prompt, greedy(5, logprobs=0))])["r"]
        model = engine.model._model
        on_device = [kw for name, kw in model.calls if name == "decode" and kw["sampling_params"]]
        assert on_device and all(kw["sampling_params"].enable_log_probs[0] for kw in on_device)
    finally:
        engine.close()
    tokens = tokens_of(out)
    assert tokens == hf_greedy(tiny_llama, prompt, 5)
    logprobs = [lp for d in out for lp in (d.logprobs or ())]
    assert [lp.token_id for lp in logprobs] == tokens
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    with torch.no_grad():
        full = torch.tensor([list(prompt) + tokens])
        ref = hf(full).logits[0].log_softmax(-1)
    for k, lp in enumerate(logprobs):
        assert lp.logprob == pytest.approx(float(ref[len(prompt) - 1 + k, tokens[k]]), abs=1e-4)


class DictTransport:
    """``KVTransport`` (our own protocol) over a dict: export and import in one process."""

    def __init__(self) -> None:
        self.payloads: dict = {}
        self.recomputes: list[str] = []

    def put(self, transfer_id, payload, timeout_s):
        self.payloads[transfer_id] = payload

    def fetch(self, transfer_id, timeout_s):
        from accel.kv_transfer.transport import KVTransferNotFound

        if transfer_id not in self.payloads:
            raise KVTransferNotFound(transfer_id)
        return self.payloads[transfer_id]

    def contains(self, transfer_id, timeout_s):
        return transfer_id in self.payloads

    def complete(self, transfer_id):
        self.payloads.pop(transfer_id, None)

    def report_recompute(self, reason):
        self.recomputes.append(reason)

    def offer_prefix(self, key, block_size, hashes, blocks):
        return 0

    def match_prefix(self, key, block_size, hashes, dtype, timeout_s):
        return []


def test_an_imported_prompt_decodes_its_own_token_not_the_slots_leftover(ttnn_stub, tiny_llama):
    """PD's decode side on tt-metal's contract, device sampling and async decode on. A request
    whose prompt KV was imported starts in a DECODE step, in a slot this generator never prefilled
    for it. tt-metal's ``Generator`` keeps, at that ``reset_batch`` step, the token and position
    the slot's previous decode left on the device when the positions continue (here: the previous
    occupant stopped at position 39, the imported prompt's last token sits at 39), unless the slot
    is marked in ``_slots_prefilled_since_decode``. The engine marks it; the output is HF's."""
    from accel.tt.kv_hooks import KVTransferHooks

    transport = DictTransport()
    hooks = KVTransferHooks(transport, str(tiny_llama))
    engine = contract_engine(ttnn_stub, tiny_llama, "all", kv_hooks=hooks, max_num_seqs=1)
    try:
        prompt, other = prompt_of(5, 40), prompt_of(6, 20)
        pre = run_requests(
            engine, [GenerateRequest("pre", prompt, greedy(1), kv_transfer=KVTransferParams(do_remote_decode=True))]
        )["pre"]
        ticket = pre[-1].kv_transfer
        assert ticket is not None and ticket.num_tokens == 40
        # 20 prompt tokens + 20 outputs: its last decode ran at position 38 and left position 39
        # and its unconsumed 20th token in the slot's device inputs.
        leftover = run_requests(engine, [GenerateRequest("a", other, greedy(20))])["a"]
        assert tokens_of(leftover) == hf_greedy(tiny_llama, other, 20)
        model = engine.model._model
        assert model._device_inputs[1][0] == 39 and model._device_inputs[0][0] == tokens_of(leftover)[-1]
        num_prefills = sum(name == "prefill" for name, _ in model.calls)
        out = run_requests(engine, [GenerateRequest("b", prompt, greedy(8), kv_transfer=ticket)])["b"]
        assert sum(name == "prefill" for name, _ in model.calls) == num_prefills  # started in decode
        assert out[-1].num_cached_tokens == 39 and transport.recomputes == []
        assert tokens_of(out) == hf_greedy(tiny_llama, prompt, 8)
    finally:
        engine.close()


def test_no_chunked_prefill_unless_the_class_declares_it(ttnn_stub, tiny_llama):
    """tt_transformers classes declare no ``supports_chunked_prefill``: whole prompts only, even
    past ``max_num_batched_tokens`` (the plugin raises the budget to max_model_len)."""
    engine = contract_engine(ttnn_stub, tiny_llama, None, max_num_batched_tokens=32)
    try:
        assert not engine.enable_chunked_prefill
        prompts = {f"c{i}": prompt_of(i, 70) for i in range(2)}
        out = run_requests(engine, [GenerateRequest(r, p, greedy(3)) for r, p in prompts.items()])
        for req_id, prompt in prompts.items():
            assert tokens_of(out[req_id]) == hf_greedy(tiny_llama, prompt, 3), req_id
        prefills = [kw for name, kw in engine.model._model.calls if name == "prefill"]
        assert prefills and all(s == 0 for kw in prefills for s in kw["start_pos"])
    finally:
        engine.close()


def test_data_parallel_lanes_only_for_classes_built_for_them(ttnn_stub, tiny_llama):
    from accel.contract import ConfigError

    with pytest.raises(ConfigError, match="use replicas: over submeshes"):
        contract_engine(ttnn_stub, tiny_llama, None, data_parallel_size=2)


# ---- each old mismatch now fails loudly ----------------------------------------------------


@pytest.fixture
def contract_class(ttnn_stub, tiny_llama):
    registry = build_registry(extra_models_dir=str(CONTRACT_MODELS_DIR), include_builtins=False)
    from transformers import AutoConfig

    return registry.resolve(AutoConfig.from_pretrained(tiny_llama), "ttnn")


def test_a_positional_warmup_call_is_a_type_error(contract_class):
    """Our old call ``warmup_model_decode(enable_trace, kv_cache=...)`` against tt-metal's signature."""
    model = object.__new__(contract_class)
    with pytest.raises(TypeError, match="multiple values for argument 'kv_cache'"):
        model.warmup_model_decode(True, kv_cache=[], max_batch_size=4, num_blocks=8, can_sample_on_device=False)
    # current WarmupForwardMixin: no non_greedy_decoding_on_device (the plugin stopped passing it)
    with pytest.raises(TypeError, match="non_greedy_decoding_on_device"):
        model.warmup_model_decode(
            kv_cache=[],
            enable_trace=True,
            max_batch_size=4,
            num_blocks=8,
            can_sample_on_device=False,
            non_greedy_decoding_on_device=False,
        )


def test_a_ttnn_kv_dtype_is_a_type_error(contract_class, ttnn_stub):
    model = object.__new__(contract_class)
    model.submeshes, model.calls = [None], []
    with pytest.raises(TypeError):
        model.allocate_kv_cache((4, 1, 32, 64), ttnn_stub.bfloat8_b, 2)


def test_sampling_params_without_enable_log_probs_are_refused(contract_class):
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class OldParams:  # our old TTSamplingParams: no enable_log_probs
        temperature: list
        top_k: list
        top_p: list
        seed: list

    model = object.__new__(contract_class)
    model.vocab_size = 8
    with pytest.raises(AttributeError, match="enable_log_probs"):
        model._sample(torch.zeros(1, 8), OldParams([0.0], [1], [1.0], [-1]), positions=[1])


def test_outputs_other_than_tt_metals_are_refused():
    rows, vocab = 4, 16
    with pytest.raises(TypeError, match=r"\[rows, 1 \(or S\), vocab\]"):
        unpack_output(torch.zeros(rows, vocab), is_tokens=False, wants_logprobs=False, num_rows=rows)
    with pytest.raises(TypeError, match="host torch tensors"):
        unpack_output(object(), is_tokens=True, wants_logprobs=False, num_rows=rows)
    with pytest.raises(TypeError, match="tokens, logprobs"):
        unpack_output(torch.zeros(rows, dtype=torch.int64), is_tokens=True, wants_logprobs=True, num_rows=rows)
    ok = unpack_output((torch.zeros(rows, 1, vocab), None), is_tokens=False, wants_logprobs=False, num_rows=2)
    assert ok.values.shape == (2, vocab)
    toks = unpack_output(torch.arange(rows).view(rows, 1), is_tokens=True, wants_logprobs=False, num_rows=rows)
    assert toks.values.tolist() == [0, 1, 2, 3]
