"""A legacy (decode contract version 0) tt-metal vLLM generator, for host tests: tt-metal's call
contract, HF's numbers.

Pinned to one upstream revision pair, read (never copied) through the code-search store:
tt-metal ``models/tt_transformers/tt/generator_vllm.py`` at 0015d62ba229715e1a2490489c17fce1ed317338
(``LlamaForCausalLM(Generator)``: ``initialize_vllm_model(hf_config, mesh_device, max_batch_size,
max_seq_len, n_layers=None, tt_data_parallel=1, optimizations="performance")``, ``model_capabilities``
on the class, ``allocate_kv_cache`` only -- that revision has no per-layer allocator -- and no
``decode_input_update_contract``: version 0), as vllm-tt-plugin e3fc849 drives it (keywords
``tokens, start_pos, page_table, kv_cache, enable_trace, read_from_device[, sampling_params,
reset_batch]``). ``decode_forward_text`` takes only ``Generator``'s own keywords plus ``**kwargs``
(no Galaxy-generator arguments); warmup is ``WarmupForwardMixin``'s current
``warmup_model_decode(kv_cache, enable_trace, max_batch_size, num_blocks, can_sample_on_device)``
(no ``non_greedy_decoding_on_device``: the plugin stopped passing it). ``seed=None`` = unseeded,
``enable_log_probs`` read on every call (``models/common/sampling/sampling_params.py``).
Return conventions are tt-metal's: prefill gives host logits ``[n, 1,
vocab]``; decode gives a device tensor whose host read-back is logits ``[B, 1, vocab]``; with
device sampling, tokens ``[B]`` or ``(tokens, logprobs)`` when a row enables log probs.

The logits come from HF transformers (fp32), recomputed from each row's context as the KV cache
holds it: prefill and decode write each token they process into the cell its page table names
(the token id in K, a written-marker in V, layer 0) and read the row's earlier tokens back from
the cells its page table names (a cell never written is an error). So an engine driving this
class correctly, prefix-cache hits and imported KV included, produces exactly HF's greedy tokens.
``instances`` and the ``calls`` log let tests look at what the engine sent; a process the test
cannot look into (a ``serve run`` replica) also appends each prefill, decode and warmup as one JSON
line to the file ``$MESHSERVE_TEST_TT_CALL_LOG`` names (``_log``).

Device-resident decode inputs, as tt-metal's ``Generator`` keeps them in its decode trace's
input buffers: after a traced decode that sampled on device, the buffers hold the sampled tokens
and the positions advanced by one; a traced decode without device sampling leaves its inputs
there (the host copies fresh ones every such step). A traced, device-sampled decode with
``reset_batch=False`` reads those buffers and ignores the host's tokens and positions (steady
state: nothing is copied). With ``reset_batch=True`` it applies the async-ahead *keep*
(``Generator.decode_forward``; tt-metal's own test of it pins the rule): per slot, the device's
token and position replace the host's when the device position continues the host's (``dev ==
host`` or ``dev == host + 1``: under vLLM's async scheduling the host trails by a step), unless
the slot is in ``_slots_prefilled_since_decode``, which ``prefill_forward_text`` fills with its
``empty_slots`` and every decode clears.

Registered like a user's tt-metal class: ``EXTRA_MODELS_DIR`` + ``vllm_metadata.json`` (this
folder for Llama; ``../tt_qwen3`` registers the same class for Qwen3).
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import fields
from typing import Any, ClassVar

import torch
import ttnn

CALL_LOG_ENV = "MESHSERVE_TEST_TT_CALL_LOG"


class _DeviceTensor:
    """What a traced decode leaves on the device (a ttnn tensor, here holding torch values)."""

    def __init__(self, value: Any) -> None:
        self.value = value


class _HostTensor:
    """A ttnn host tensor after ``.cpu(blocking=False)``: not yet a torch tensor."""

    def __init__(self, value: Any) -> None:
        self.value = value


class HFContractGenerator:
    # Class-level capabilities, tt_transformers style (no supports_chunked_prefill: the plugin
    # then turns chunked prefill off).
    model_capabilities: ClassVar[dict[str, Any]] = {
        "supports_prefix_caching": True,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
    }
    instances: ClassVar[list[HFContractGenerator]] = []
    max_tokens_calls: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, hf_model: Any, mesh_device: Any, submeshes: list[Any], max_batch_size: int) -> None:
        self.hf_model = hf_model
        self.mesh_device = mesh_device
        self.submeshes = submeshes
        self.data_parallel = len(submeshes)
        self.max_batch_size = max_batch_size
        self.vocab_size = int(hf_model.config.vocab_size)
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.kv_cache: Any = None  # what allocate_kv_cache returned: [lane][layer] = [K, V]
        self._slots_prefilled_since_decode: set[int] = set()
        self._device_inputs: tuple[list[int], list[int]] | None = None  # trace inputs: tokens, positions
        self.already_warmed_up_prefill = False
        HFContractGenerator.instances.append(self)

    # ---- construction (generator_vllm.py) ----
    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config,
        mesh_device,
        max_batch_size,
        max_seq_len,
        n_layers=None,
        tt_data_parallel=1,
        optimizations: str = "performance",
    ):
        from transformers import AutoModelForCausalLM

        assert isinstance(mesh_device, ttnn.MeshDevice), f"mesh_device is {type(mesh_device).__name__}"
        rows, cols = mesh_device.shape.dims
        assert (rows * cols) % tt_data_parallel == 0 and max_batch_size % tt_data_parallel == 0
        submeshes = mesh_device.create_submeshes(ttnn.MeshShape(1, rows * cols // tt_data_parallel))
        hf_model = AutoModelForCausalLM.from_pretrained(hf_config._name_or_path, dtype=torch.float32).eval()
        return cls(hf_model, mesh_device, submeshes, max_batch_size)

    @classmethod
    def get_max_tokens_all_users(cls, model_name, num_devices, tt_data_parallel, max_model_len, max_num_seqs):
        cls.max_tokens_calls.append(
            dict(num_devices=num_devices, tt_data_parallel=tt_data_parallel, max_num_seqs=max_num_seqs)
        )
        return max_num_seqs * max_model_len

    # ---- KV (allocate_vllm_kv_cache: this revision's LlamaForCausalLM offers no per-layer call) ----
    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        self.calls.append(("allocate_kv_cache", {"kv_cache_shape": kv_cache_shape, "dtype": dtype}))
        return self._zero_kv([(kv_cache_shape, dtype, i) for i in range(num_layers)])

    def _zero_kv(self, per_layer_specs):
        kv_cache = []
        for _ in self.submeshes:
            # tt-metal: torch.zeros(shape, dtype=dtype), then ttnn.as_tensor(..., dtype=bfloat8_b)
            kv_cache.append(
                [
                    [torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)]
                    for shape, dtype, _ in per_layer_specs
                ]
            )
        self.kv_cache = kv_cache
        return kv_cache

    # ---- prefill (Generator.prefill_forward_text) ----
    def prefill_forward(self, *args, **kwargs):
        self._log("prefill", empty_slots=kwargs.get("empty_slots"), start_pos=kwargs.get("start_pos"))
        return self.prefill_forward_text(*args, **kwargs)

    def prefill_forward_text(
        self,
        tokens: torch.Tensor,
        page_table=None,
        kv_cache=None,
        prompt_lens=None,
        empty_slots=None,
        enable_trace=True,
        model_id_warmup=None,
        sampling_params=None,
        start_pos=None,
        return_hidden_states=False,
        warmup_prefill=True,
        **kwargs,
    ):
        self.calls.append(("prefill", dict(kwargs, sampling_params=sampling_params, start_pos=start_pos)))
        assert isinstance(page_table, torch.Tensor), "page_table must be torch.Tensor"
        batch_size = tokens.shape[0]
        prompt_lens = prompt_lens if prompt_lens is not None else [tokens.shape[1]] * batch_size
        empty_slots = empty_slots if empty_slots is not None else list(range(batch_size))
        starts = [0] * batch_size if start_pos is None else [int(p) for p in start_pos]
        rows = []
        for idx, user_id in enumerate(empty_slots):
            seq_len, lane = int(prompt_lens[idx]), self._lane(int(user_id))
            blocks = page_table[idx].tolist()
            # Tokens before start_pos are in KV already (a prefix hit); the rest are processed.
            context = self._read_kv(lane, blocks, starts[idx]) + tokens[idx, starts[idx] : seq_len].tolist()
            for pos in range(starts[idx], seq_len):
                self._write_kv(lane, blocks, pos, context[pos])
            rows.append(self._last_logits(context))
        self._slots_prefilled_since_decode.update(int(s) for s in empty_slots)
        logits = torch.stack(rows)[:, None, :]  # [n, 1, vocab]
        if sampling_params is None:
            return logits
        return self._sample(logits[:, 0], sampling_params, positions=[int(n) for n in prompt_lens])

    # ---- decode (Generator.decode_forward_text) ----
    def decode_forward(self, *args, **kwargs):
        self._log_decode(kwargs)
        return self.decode_forward_text(*args, **kwargs)

    def decode_forward_text(
        self,
        tokens,
        start_pos,
        page_table=None,
        kv_cache=None,
        enable_trace=True,
        read_from_device=True,
        sampling_params=None,
        reset_batch=False,
        prompt_tokens=None,
        output_tokens=None,
        **kwargs,
    ):
        self.calls.append(
            (
                "decode",
                dict(
                    sampling_params=sampling_params,
                    reset_batch=reset_batch,
                    extra=sorted(kwargs),
                    histories=prompt_tokens is not None and output_tokens is not None,
                ),
            )
        )
        batch = tokens.shape[0]
        assert batch == self.max_batch_size, "a traced decode runs its captured batch"
        on_device = sampling_params is not None
        inputs = [int(t) for t in tokens[:, 0].tolist()]
        positions = [int(p) for p in start_pos.tolist()]
        if on_device and enable_trace and self._device_inputs is not None:
            dev_tokens, dev_positions = self._device_inputs
            if not reset_batch:  # steady: the trace runs on what the last decode left on the device
                inputs, positions = list(dev_tokens), list(dev_positions)
            else:  # the async-ahead keep
                for slot in range(batch):
                    continues = dev_positions[slot] in (positions[slot], positions[slot] + 1)
                    if continues and slot not in self._slots_prefilled_since_decode:
                        inputs[slot], positions[slot] = dev_tokens[slot], dev_positions[slot]
        self._slots_prefilled_since_decode = set()
        logits = torch.zeros(batch, 1, self.vocab_size)
        for row, pos in enumerate(positions):
            if pos < 0:
                continue  # empty slot
            lane, blocks = self._lane(row), page_table[row].tolist()
            self._write_kv(lane, blocks, pos, inputs[row])
            logits[row, 0] = self._last_logits(self._read_kv(lane, blocks, pos + 1))
        if sampling_params is None:
            out = _DeviceTensor(logits)
            if enable_trace:
                self._device_inputs = (inputs, positions)
        else:
            sampled = self._sample(
                logits[:, 0],
                sampling_params,
                positions=[p + 1 for p in positions],
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
            )
            out = _DeviceTensor(sampled)
            if enable_trace:
                next_tokens = sampled[0] if isinstance(sampled, tuple) else sampled
                self._device_inputs = ([int(t) for t in next_tokens], [p + 1 if p >= 0 else p for p in positions])
        if read_from_device:
            return self.process_decode_output_host(self.read_decode_output(out), is_tokens=sampling_params is not None)
        return out

    def read_decode_output(self, tt_out, async_read=False):
        assert isinstance(tt_out, _DeviceTensor), f"read_decode_output got {type(tt_out).__name__}"
        self.calls.append(("read_decode_output", {"async_read": async_read}))
        host = _HostTensor(tt_out.value)
        if async_read:
            return host, [ttnn.record_event(self.mesh_device, 0)]
        return host

    def process_decode_output_host(self, tt_out, is_tokens=False):
        # a read-back host tensor (async path), or the device output itself (the plugin's
        # synchronous path: ttnn.to_torch reads it back, blocking)
        assert isinstance(tt_out, (_HostTensor, _DeviceTensor)), f"process_decode_output_host got {type(tt_out)}"
        self.calls.append(("process_decode_output_host", {"on_device": isinstance(tt_out, _DeviceTensor)}))
        value = tt_out.value
        tokens = value[0] if isinstance(value, tuple) else value
        assert is_tokens == (tokens.dim() == 1), "is_tokens must say whether the decode sampled on device"
        return value

    # ---- warmup (WarmupForwardMixin) ----
    def warmup_model_prefill(self, kv_cache, enable_trace, can_sample_on_device):
        self.calls.append(
            ("warmup_prefill", dict(enable_trace=enable_trace, can_sample_on_device=can_sample_on_device))
        )
        self.already_warmed_up_prefill = True

    def warmup_model_decode(self, kv_cache, enable_trace, max_batch_size, num_blocks, can_sample_on_device):
        self.calls.append(("warmup_decode", dict(enable_trace=enable_trace, max_batch_size=max_batch_size)))
        self._log("warmup_decode")
        tokens = torch.zeros(max_batch_size, 1, dtype=torch.int32)
        start_pos = torch.full((max_batch_size,), -1, dtype=torch.int32)
        page_table = torch.zeros(max_batch_size, num_blocks, dtype=torch.int32)
        self.decode_forward(
            tokens=tokens,
            start_pos=start_pos,
            page_table=page_table,
            kv_cache=kv_cache,
            enable_trace=enable_trace,
            read_from_device=True,
            sampling_params=None,
        )

    # ---- the call log a serve-run test reads ----
    def _log(self, event: str, **values: Any) -> None:
        """One JSON line per call to ``$MESHSERVE_TEST_TT_CALL_LOG`` (nothing when unset)."""
        path = os.environ.get(CALL_LOG_ENV)
        if not path:
            return
        record = {"class": type(self).__name__, "pid": os.getpid(), "instance": id(self), "event": event}
        record.update({k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in values.items()})
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def _log_decode(self, kwargs: dict[str, Any]) -> None:
        """A decode as sent: the keyword names, whether it samples on the device, the host's
        positions and page table, and the contract's keywords (``reset_batch``, the four
        commands, ``slot_remap``) where present."""
        contract = ("reset_batch", "reload_inputs", "reload_page_table", "reload_sampling_params")
        contract += ("reset_sampling_state", "slot_remap")
        self._log(
            "decode",
            keywords=sorted(kwargs),
            on_device=kwargs.get("sampling_params") is not None,
            start_pos=kwargs.get("start_pos"),
            page_table=kwargs.get("page_table"),
            **{k: _plain(kwargs[k]) for k in contract if k in kwargs},
        )

    # ---- internals ----
    def _lane(self, slot: int) -> int:
        return slot // (self.max_batch_size // self.data_parallel)

    def _cell(self, lane: int, blocks: list[int], pos: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        keys, values = self.kv_cache[lane][0]
        block_size = keys.shape[2]
        return keys, values, int(blocks[pos // block_size]), pos % block_size

    def _write_kv(self, lane: int, blocks: list[int], pos: int, token: int) -> None:
        keys, values, block, offset = self._cell(lane, blocks, pos)
        keys[block, 0, offset, 0], keys[block, 0, offset, 1] = divmod(int(token), 256)  # exact in any float dtype
        values[block, 0, offset, 0] = 1.0

    def _read_kv(self, lane: int, blocks: list[int], num_tokens: int) -> list[int]:
        """The row's tokens at positions ``[0, num_tokens)``, read from the cells its page table names."""
        out = []
        for pos in range(num_tokens):
            keys, values, block, offset = self._cell(lane, blocks, pos)
            assert values[block, 0, offset, 0] == 1.0, f"lane {lane}: position {pos} (block {block}) was never written"
            out.append(int(keys[block, 0, offset, 0]) * 256 + int(keys[block, 0, offset, 1]))
        return out

    @torch.no_grad()
    def _last_logits(self, token_ids: list[int]) -> torch.Tensor:
        return self.hf_model(input_ids=torch.tensor([token_ids])).logits[0, -1].float()

    def _sample(
        self, logits: torch.Tensor, sampling_params: Any, positions: list[int], prompt_tokens=None, output_tokens=None
    ) -> Any:
        """Device sampling as ``format_sampling_params`` reads the params: every field by name,
        ``enable_log_probs`` included; ``seed`` None = unseeded. Penalties read the rows' token
        histories (``prompt_tokens`` / ``output_tokens``, -1 padded, as the plugin sends them
        with a decode); penalties without them are an error, not a silent no-op."""
        params = {f.name: getattr(sampling_params, f.name) for f in fields(sampling_params)}
        enable_log_probs = sampling_params.enable_log_probs  # AttributeError if the engine leaves it out
        rows = logits.shape[0]
        for name in ("temperature", "top_k", "top_p", "seed"):
            assert len(params[name]) == rows, f"sampling_params.{name}: {len(params[name])} rows, batch {rows}"
        logits = logits.clone()
        for i in range(rows):
            rep, freq, pres = (params[n][i] for n in ("repetition_penalty", "frequency_penalty", "presence_penalty"))
            if rep == 1.0 and freq == 0.0 and pres == 0.0:
                continue
            assert prompt_tokens is not None and output_tokens is not None, "penalties need the token histories"
            prompt = [int(t) for t in prompt_tokens[i].tolist() if t >= 0]
            output = [int(t) for t in output_tokens[i].tolist() if t >= 0]
            _apply_penalties(logits[i], prompt, output, rep, freq, pres)
        tokens = torch.empty(rows, dtype=torch.int64)
        for i in range(rows):
            temperature, top_k, top_p, seed = (params[n][i] for n in ("temperature", "top_k", "top_p", "seed"))
            if temperature == 0 or top_k == 1:
                tokens[i] = int(logits[i].argmax())
                continue
            probs = torch.softmax(logits[i] / temperature, dim=-1)
            if 0 < top_k < self.vocab_size:
                kth = probs.topk(int(top_k)).values[-1]
                probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
            gen = torch.Generator()
            gen.manual_seed(random.randint(0, 2**31) if seed is None else int(seed) * 1_000_003 + positions[i])
            tokens[i] = int(torch.multinomial(probs, 1, generator=gen)[0])
        if not any(enable_log_probs):
            return tokens
        logprobs = logits.log_softmax(-1).gather(1, tokens[:, None]).squeeze(1)
        return tokens, logprobs


def _plain(value: Any) -> Any:
    """A keyword's value as JSON: a remap (list or tensor) as a list of ints."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else value


def _apply_penalties(x: torch.Tensor, prompt: list[int], output: list[int], rep: float, freq: float, pres: float):
    """vLLM's penalties on one row's logits ``[vocab]``, in place: repetition over prompt and
    output tokens (positive logits divided, negative multiplied), frequency and presence over the
    output tokens."""
    seen = sorted(set(prompt) | set(output))
    if rep != 1.0 and seen:
        vals = x[seen]
        x[seen] = torch.where(vals > 0, vals / rep, vals * rep)
    if output:
        counts = torch.bincount(torch.tensor(output), minlength=x.shape[0]).float()
        x -= freq * counts + pres * (counts > 0).float()
