"""The model side of the TT mesh engine: the interface tt-metal's model classes give vLLM.

The engine (``accel/tt/engine*``) only ever talks to a ``MeshModel``. On a Tenstorrent mesh the
implementation is a tt-metal generator class (driven through ttnn); everywhere else it is
``TorchMeshModel``, which implements the same calls and behaves like a compiled mesh program
(fixed decode width, bucketed prefill, paged KV per lane, sampling inside the program, really
asynchronous read-back).

Shapes (B_wire = lanes * per_lane decode slots; row == global slot; lane = row // per_lane):

- KV cache: ``kv[lane][layer] == [K, V]``, each ``(num_blocks, num_kv_heads, block_size, head_dim)``;
  block ids in page tables are **lane-local** (the same id in two lanes is different memory).
- prefill: ``tokens`` int64 ``[n, max_len]`` (front-packed rows, no batch padding);
  ``page_table`` int32 ``[n, max_blocks_per_req]``; ``prompt_lens[i]`` = end of the scheduled
  chunk; ``start_pos[i]`` = tokens already in KV (prefix hit / earlier chunks); the model
  processes ``tokens[i, start_pos[i]:prompt_lens[i]]``; ``empty_slots[i]`` = the row's global
  slot (which selects its lane's KV). Returns logits ``[n, 1, vocab]`` (last position) or, with
  ``sampling_params``, a ``SampledOutput``.
- decode: ``tokens`` int64 ``[B_wire, 1]``, ``start_pos`` int32 ``[B_wire]`` (-1 = empty slot: no
  KV write, output ignored), ``page_table`` int32 ``[B_wire, max_blocks_per_req]``. Returns a
  device handle; ``read_decode_output`` starts the copy to host and returns ``(out, events)``;
  after every event's ``synchronize()`` the engine calls ``process_decode_output_host``, which
  gives logits ``[B_wire, vocab]`` or a ``SampledOutput`` (device sampling).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

# Keys of ``model_capabilities`` (read with ``.get(key, False)``: missing = unsupported).
SUPPORTS_PREFIX_CACHING = "supports_prefix_caching"
SUPPORTS_ASYNC_DECODE = "supports_async_decode"
SUPPORTS_SAMPLE_ON_DEVICE = "supports_sample_on_device"
MAX_DEVICE_TOP_K = "max_device_top_k"  # int; device sampler's candidate set (tt-metal: 32)


@dataclass(frozen=True)
class TTSamplingParams:
    """Per-row device sampling arguments (lists of length n for prefill, B_wire for decode).

    Padding rows use ``PAD_DEFAULTS``. ``seed`` -1 = unseeded; ``num_logprobs`` -2 = none.
    """

    temperature: Sequence[float]
    top_k: Sequence[int]
    top_p: Sequence[float]
    presence_penalty: Sequence[float]
    frequency_penalty: Sequence[float]
    repetition_penalty: Sequence[float]
    seed: Sequence[int]
    num_logprobs: Sequence[int]

    PAD_DEFAULTS: ClassVar[Mapping[str, Any]] = {
        "temperature": 0.0,
        "top_k": 1,
        "top_p": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "seed": -1,
        "num_logprobs": -2,
    }


@dataclass(frozen=True)
class SampledOutput:
    """Device-sampled result: ``token_ids`` int64 ``[rows]``; ``logprobs`` float ``[rows]`` of the
    sampled tokens, or None when no row asked for logprobs."""

    token_ids: Any
    logprobs: Any | None = None


@runtime_checkable
class DeviceEvent(Protocol):
    """Completion of an asynchronous device-to-host copy (a ttnn MeshEvent behind an adapter,
    or a future on the torch backend)."""

    def synchronize(self) -> None: ...


@runtime_checkable
class MeshModel(Protocol):
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

    def allocate_kv_cache(
        self, kv_cache_shape: tuple[int, int, int, int], dtype: Any, num_layers: int
    ) -> list[list[list[Any]]]:
        """Zeroed KV for every lane: ``[lane][layer] = [K, V]`` of ``kv_cache_shape``."""
        ...

    def prefill_forward(
        self,
        tokens: Any,
        page_table: Any,
        kv_cache: Any,
        prompt_lens: Sequence[int],
        start_pos: Sequence[int],
        empty_slots: Sequence[int],
        sampling_params: TTSamplingParams | None = None,
        enable_trace: bool = False,
        **kwargs: Any,
    ) -> Any: ...

    def decode_forward(
        self,
        tokens: Any,
        start_pos: Any,
        page_table: Any,
        kv_cache: Any,
        enable_trace: bool = True,
        read_from_device: bool = True,
        sampling_params: TTSamplingParams | None = None,
        reset_batch: bool = False,
        **kwargs: Any,
    ) -> Any: ...

    def read_decode_output(self, out: Any, async_read: bool = False) -> tuple[Any, list[DeviceEvent]]: ...

    def process_decode_output_host(self, out: Any, is_tokens: bool = False) -> Any: ...

    def warmup_model_prefill(self, enable_trace: bool, kv_cache: Any, can_sample_on_device: bool) -> None: ...

    def warmup_model_decode(
        self, enable_trace: bool, kv_cache: Any, max_batch_size: int, num_blocks: int, can_sample_on_device: bool
    ) -> None: ...
