"""The model side of the TT mesh engine: the contract tt-metal's model classes give vLLM.

The engine (``accel/tt/engine*``) only ever talks to a ``MeshModel``. On a Tenstorrent mesh the
implementation is a tt-metal generator class (``models/tt_transformers/tt/generator_vllm.py`` and
friends), plugged in unchanged; everywhere else it is ``TorchMeshModel``, which implements the same
calls with the same argument names, dtypes and return conventions (fixed decode width, bucketed
prefill, paged KV per lane, sampling inside the program, really asynchronous read-back). The
engine side adapts to the contract exactly as vllm-tt-plugin's ``TTModelRunner`` does
(``accel.tt.model_output`` unpacks outputs, ``accel.tt.model_calls`` makes the optional calls).

Shapes (B_wire = lanes * per_lane decode slots; row == global slot; lane = row // per_lane):

- KV cache: ``allocate_kv_cache(kv_cache_shape, dtype, num_layers)`` or, when the class has it,
  ``allocate_kv_cache_per_layer([(shape, dtype, tensor_idx), ...])``; ``dtype`` is a **torch**
  dtype (tt-metal starts with ``torch.zeros(shape, dtype=dtype)`` and picks the ttnn dtype
  itself). Returns ``kv[lane][layer] == [K, V]``, each ``(num_blocks, num_kv_heads, block_size,
  head_dim)``; block ids in page tables are **lane-local**.
- prefill: ``tokens`` ``[n, max_len]`` (front-packed rows, no batch padding); ``page_table``
  int32 ``[n, max_blocks_per_req]``; ``prompt_lens[i]`` = end of the scheduled chunk;
  ``start_pos[i]`` = tokens already in KV; the model processes ``tokens[i, start_pos[i]:
  prompt_lens[i]]``; ``empty_slots[i]`` = the row's global slot. Returns host logits
  ``[n, 1, vocab]`` or, with ``sampling_params``, tokens ``[n]`` / ``(tokens, logprobs)``.
- decode: ``tokens`` ``[B_wire, 1]``, ``start_pos`` int32 ``[B_wire]`` (-1 = empty slot: no KV
  write, output ignored), ``page_table`` int32 ``[B_wire, max_blocks_per_req]``. With
  ``read_from_device=False`` returns a device handle; ``read_decode_output(out,
  async_read=True)`` returns ``(host_out, events)``; after every event is synchronized the engine
  calls ``process_decode_output_host(host_out, is_tokens=...)`` unless ``host_out`` is already
  torch tensors. The result is tt-metal's: logits ``[B_wire, 1, vocab]`` (or a ``(logits,
  log_probs)`` tuple), or device-sampled tokens ``[B_wire]`` (``[B_wire, 1]`` accepted) or a
  ``(tokens, logprobs)`` tuple when a row enabled log probs.
- decode contract (``accel.tt.decode_contract``): a class without ``decode_input_update_contract``
  (or 0) gets ``reset_batch`` on device-sampling decodes; one declaring 1 gets the four
  keyword-only commands ``reload_inputs, reload_page_table, reload_sampling_params,
  reset_sampling_state`` and ``slot_remap`` on every decode, never ``reset_batch``.
- warmup: ``warmup_model_prefill(kv_cache=, enable_trace=, can_sample_on_device=)`` and
  ``warmup_model_decode(kv_cache=, enable_trace=, max_batch_size=, num_blocks=,
  can_sample_on_device=[, non_greedy_decoding_on_device=])`` -- always by keyword: every real
  signature takes ``kv_cache`` first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

# Keys of ``model_capabilities`` as tt-metal and the plugin spell them (read with
# ``.get(key, False)``: a missing key means "not supported").
SUPPORTS_PREFIX_CACHING = "supports_prefix_caching"
SUPPORTS_ASYNC_DECODE = "supports_async_decode"
SUPPORTS_SAMPLE_ON_DEVICE = "supports_sample_on_device"
SUPPORTS_CHUNKED_PREFILL = "supports_chunked_prefill"
MAX_DEVICE_TOP_K = "max_device_top_k"  # int; device sampler's candidate set (tt-metal: 32)
# vllm-tt-plugin's own key (docs/MODEL_CAPABILITIES.md at 0827ce57), default True there: a class
# that does not declare it gets device penalties on decode, with the token histories
# (``prompt_tokens`` / ``output_tokens``, int32 ``[B_wire, L]`` padded with -1) the plugin passes
# to ``decode_forward`` (``device_sampling_args.penalty_histories``). The plugin sends no history
# with a prefill, so a penalized prefill row samples on the host (its first token would otherwise
# ignore the prompt's repetition penalty).
SUPPORTS_DEVICE_PENALTIES = "supports_device_penalties"
# Our own declaration (no tt-metal key exists for it): the class folds ``tt_data_parallel`` lanes
# into one process. The plugin decides this by class (Galaxy generators, GPT-OSS); see
# ``accel.tt.registry.LANE_DP_CLASSES``.
SUPPORTS_DATA_PARALLEL_LANES = "supports_data_parallel_lanes"


@dataclass(frozen=True)
class TTSamplingParams:
    """Per-row device sampling arguments, vllm-tt-plugin's ``TTSamplingParams`` on its device path
    (lists of length n for prefill, B_wire for decode; tt-metal's ``format_sampling_params`` reads
    these names). ``seed`` None = unseeded (any int is an explicit seed); ``num_logprobs`` -2 =
    none; ``enable_log_probs[i] == (num_logprobs[i] >= 0)``. Padding rows use ``PAD_DEFAULTS``."""

    temperature: Sequence[float]
    top_k: Sequence[int]
    top_p: Sequence[float]
    presence_penalty: Sequence[float]
    frequency_penalty: Sequence[float]
    repetition_penalty: Sequence[float]
    seed: Sequence[int | None]
    num_logprobs: Sequence[int]
    enable_log_probs: Sequence[bool]

    PAD_DEFAULTS: ClassVar[Mapping[str, Any]] = {
        "temperature": 0.0,
        "top_k": 1,
        "top_p": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "seed": None,
        "num_logprobs": -2,
        "enable_log_probs": False,
    }


@runtime_checkable
class DeviceEvent(Protocol):
    """Completion of an asynchronous device-to-host copy, as the engine waits on it: a ttnn
    ``MeshEvent`` behind ``backend.TtnnEvent`` (``ttnn.event_synchronize``), or the torch
    program's future."""

    def synchronize(self) -> None: ...


@runtime_checkable
class MeshModel(Protocol):
    """tt-metal's vLLM model-class contract (the calls vllm-tt-plugin makes). Optional members,
    used when present: ``allocate_kv_cache_per_layer``, ``get_max_tokens_all_users``
    (classmethod), ``already_warmed_up_prefill``; and ours, on the ttnn adapter:
    ``use_host_inputs(slots)`` before a decode whose batch changed: the slots whose device-side
    state belongs to another request."""

    model_capabilities: ClassVar[Mapping[str, Any]]

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config: Any,
        mesh_device: Any,
        max_batch_size: int,
        max_seq_len: int = ...,
        n_layers: int | None = None,
        tt_data_parallel: int = 1,
        optimizations: str | None = None,
    ) -> MeshModel:
        """``max_batch_size`` is the global slot count (lanes x per-lane); ``tt_data_parallel``
        is the lane count."""
        ...

    def allocate_kv_cache(self, kv_cache_shape: tuple[int, int, int, int], dtype: Any, num_layers: int) -> Any:
        """Zeroed KV for every lane: ``[lane][layer] = [K, V]`` of ``kv_cache_shape``; ``dtype``
        a torch dtype."""
        ...

    def prefill_forward(self, *args: Any, **kwargs: Any) -> Any:
        """Called with keywords: ``tokens, page_table, kv_cache, prompt_lens, start_pos,
        empty_slots, enable_trace[, sampling_params]``."""
        ...

    def decode_forward(self, *args: Any, **kwargs: Any) -> Any:
        """Called with keywords: ``tokens, start_pos, page_table, kv_cache, enable_trace,
        read_from_device[, sampling_params]`` and the negotiated contract's keywords (version 0:
        ``reset_batch`` with device sampling; version 1: the four reload commands and
        ``slot_remap``)."""
        ...

    def read_decode_output(self, tt_out: Any, async_read: bool = False) -> Any:
        """``async_read=True``: ``(host_out, events)``; False: ``host_out``."""
        ...

    def process_decode_output_host(self, tt_out: Any, is_tokens: bool = False) -> Any: ...

    def warmup_model_prefill(self, kv_cache: Any, enable_trace: bool, can_sample_on_device: bool) -> None: ...

    def warmup_model_decode(
        self, kv_cache: Any, enable_trace: bool, max_batch_size: int, num_blocks: int, can_sample_on_device: bool
    ) -> None: ...
