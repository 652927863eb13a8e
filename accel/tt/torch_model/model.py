"""``TorchMeshModel``: the ``MeshModel`` contract implemented in torch, behaving like a mesh program.

What makes it "compiled-like" (and therefore a faithful stand-in for a tt-metal generator):
- decode always runs the full slot batch ``B_wire = lanes x per_lane`` (row == global slot; rows
  with ``start_pos == -1`` write no KV and their outputs are garbage the engine ignores);
- prefill pads each row's chunk length to its bucket (<= 128 -> 128, else the next power of two)
  and runs each bucket's rows as one batch, as tt-metal pads each prefill user on its own;
- KV is paged per lane (``paged_attention.PagedKVStore``); the row's lane is ``slot // per_lane``;
- sampling (``sampler.py``) runs inside the program and returns token ids (+ logprobs);
- every forward runs on a single-worker device queue, so ``decode_forward(read_from_device=False)``
  returns at once and the host overlaps the next step's scheduling with this step's compute.
Runs on CUDA when available (fp32; warmup logs each shape), on CPU otherwise (fp32, eager).
The forward pass itself is ``decoder.decoder_forward``; the fixed shapes and the warmup that runs
each once are ``warmup``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from accel.tt.host_arrays import host_copy
from accel.tt.mesh_model import (
    MAX_DEVICE_TOP_K,
    SUPPORTS_ASYNC_DECODE,
    SUPPORTS_CHUNKED_PREFILL,
    SUPPORTS_DATA_PARALLEL_LANES,
    SUPPORTS_DEVICE_PENALTIES,
    SUPPORTS_PREFIX_CACHING,
    SUPPORTS_SAMPLE_ON_DEVICE,
    TTSamplingParams,
)
from accel.tt.torch_model.config import DecoderConfig
from accel.tt.torch_model.decode_mirror import DecodeMirror, build_mirror
from accel.tt.torch_model.decoder import decoder_forward
from accel.tt.torch_model.device_queue import DeviceQueue, DeviceTime, FutureEvent, PendingDecode
from accel.tt.torch_model.layers import RotaryTables
from accel.tt.torch_model.paged_attention import PagedKVStore, check_block_ids, num_ctx_blocks
from accel.tt.torch_model.prefill_batch import PrefillBatch
from accel.tt.torch_model.sampler import DecodeSamplingCache, prepare_sampling, sample
from accel.tt.torch_model.warmup import CTX_TOKEN_ALIGN, round_up, warm_decode, warm_prefill
from accel.tt.torch_model.weights import ModelWeights, load_weights

logger = logging.getLogger(__name__)


class TorchMeshModel:
    model_capabilities: ClassVar[dict[str, Any]] = {
        SUPPORTS_PREFIX_CACHING: True,
        SUPPORTS_ASYNC_DECODE: True,
        SUPPORTS_SAMPLE_ON_DEVICE: True,
        SUPPORTS_DEVICE_PENALTIES: False,  # no token-history inputs: penalties sample on the host
        # Prefill resumes at any ``start_pos`` (paged KV, lane-local blocks): chunks are exact.
        SUPPORTS_CHUNKED_PREFILL: True,
        # One instance drives every lane (``tt_data_parallel`` KV sets, one decode batch).
        SUPPORTS_DATA_PARALLEL_LANES: True,
        MAX_DEVICE_TOP_K: 32,
    }

    def __init__(
        self,
        config: DecoderConfig,
        weights: ModelWeights,
        *,
        max_batch_size: int,
        max_seq_len: int,
        num_lanes: int,
        device: torch.device,
        dtype: torch.dtype,
        seed: int | None = None,
    ) -> None:
        if num_lanes < 1 or max_batch_size % num_lanes:
            raise ValueError(f"max_batch_size {max_batch_size} must be a multiple of the lane count {num_lanes}")
        self.config = config
        self.weights = weights
        self.max_batch_size = max_batch_size  # B_wire: global decode slots
        self.max_seq_len = max_seq_len
        self.num_lanes = num_lanes
        self.per_lane = max_batch_size // num_lanes
        self._slot_lanes = torch.arange(max_batch_size) // self.per_lane  # [B_wire]: each decode slot's lane
        self.device = device
        self.dtype = dtype
        self.rope = RotaryTables.build(config, max_seq_len + 1, device, dtype)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
        self.captured_shapes: list[tuple[str, tuple[int, ...], str]] = []  # (phase, shape, variant)
        self._store: PagedKVStore | None = None
        self._queue = DeviceQueue()
        self._decode_sampling = DecodeSamplingCache(config.vocab_size, device)
        self._mirror: DecodeMirror | None = None  # CPU: each slot's decode context (decode_mirror)
        # mrope programs: int64 [B_wire], each slot's rotary position offset (``rope_deltas_all_users``)
        self._rope_deltas: torch.Tensor | None = None

    # ---- construction (the tt-metal classmethods) ----

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config: Any,
        mesh_device: Any,
        max_batch_size: int,
        max_seq_len: int | None = None,
        n_layers: int | None = None,
        tt_data_parallel: int = 1,
        optimizations: str | None = None,
        checkpoint_dir: str | Path | None = None,
    ) -> TorchMeshModel:
        """Build from an HF config. Weights come from ``checkpoint_dir`` or, as with
        ``AutoConfig.from_pretrained(dir)``, ``hf_config._name_or_path``. ``mesh_device`` is
        ignored (None off-hardware); ``optimizations`` is accepted for interface parity."""
        model_dir = Path(checkpoint_dir or getattr(hf_config, "_name_or_path", "") or "")
        if not str(model_dir) or not model_dir.is_dir():
            raise ValueError(
                f"TorchMeshModel needs a local checkpoint folder; got {str(model_dir)!r} "
                "(pass checkpoint_dir= or load hf_config with AutoConfig.from_pretrained(dir))"
            )
        config = DecoderConfig.from_hf(hf_config, n_layers)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.float32
        max_seq_len = int(max_seq_len or config.max_position_embeddings)
        weights = load_weights(model_dir, config, device, dtype)
        logger.info(
            "TorchMeshModel %s: %d layers, %d lanes x %d slots, max_seq_len %d on %s",
            config.architecture,
            config.num_layers,
            tt_data_parallel,
            max_batch_size // max(tt_data_parallel, 1),
            max_seq_len,
            device,
        )
        return cls(
            config,
            weights,
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            num_lanes=tt_data_parallel,
            device=device,
            dtype=dtype,
        )

    @classmethod
    def get_max_tokens_all_users(
        cls,
        model_name: str | None = None,
        num_devices: int = 1,
        tt_data_parallel: int = 1,
        max_model_len: int = 0,
        max_num_seqs: int = 0,
    ) -> int:
        """KV token pool per lane: every per-lane sequence at full length."""
        return max_num_seqs * max_model_len

    def close(self) -> None:
        self._queue.close()

    def device_time(self) -> DeviceTime:
        """Programs run so far and the time spent in them (for benchmarks; not tt-metal's)."""
        return self._queue.device_time()

    def device_ping(self) -> None:
        """Returns once the device queue has run everything submitted before it (the torch
        program's ``ttnn.synchronize_device``; the engine's health check probes with it)."""
        self._queue.run(lambda: None)

    # ---- KV ----

    def allocate_kv_cache(
        self, kv_cache_shape: tuple[int, int, int, int], dtype: Any, num_layers: int
    ) -> list[list[list[torch.Tensor]]]:
        """``[lane][layer] = [K, V]`` zeroed ``(num_blocks, Hkv, block_size, D)`` lane-local views
        of torch ``dtype`` (tt-metal's contract: a torch dtype, never a ttnn one)."""
        num_blocks, num_kv_heads, block_size, head_dim = kv_cache_shape
        cfg = self.config
        if (num_kv_heads, head_dim, num_layers) != (cfg.num_kv_heads, cfg.head_dim, cfg.num_layers):
            raise ValueError(
                f"kv_cache_shape {tuple(kv_cache_shape)} x {num_layers} layers does not fit "
                f"the model (Hkv {cfg.num_kv_heads}, head_dim {cfg.head_dim}, {cfg.num_layers} layers)"
            )
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"allocate_kv_cache needs a torch floating dtype, got {dtype!r}")
        kv_dtype = dtype
        self._store = PagedKVStore.allocate(
            self.num_lanes, num_layers, (num_blocks, num_kv_heads, block_size, head_dim), self.device, kv_dtype
        )
        self._mirror = build_mirror(self._store, self._slot_lanes.tolist(), self.max_seq_len)
        return self._store.lane_views()

    def _store_for(self, kv_cache: Any) -> PagedKVStore:
        if self._store is None or not self._store.is_backing(kv_cache):
            raise ValueError("kv_cache must be the structure returned by this model's allocate_kv_cache")
        return self._store

    # ---- prefill ----

    def prefill_forward(
        self,
        tokens: Any,
        page_table: Any,
        kv_cache: Any,
        prompt_lens: Sequence[int],
        start_pos: Sequence[int] | None = None,
        empty_slots: Sequence[int] | None = None,
        sampling_params: TTSamplingParams | None = None,
        enable_trace: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Processes ``tokens[i, start_pos[i]:prompt_lens[i]]`` of each row; returns logits
        ``[n, 1, vocab]`` of each chunk's last token, or (``sampling_params``) tokens ``[n]`` /
        ``(tokens, logprobs)`` when a row enabled log probs."""
        store = self._store_for(kv_cache)
        batch = PrefillBatch.stage(
            tokens,
            page_table,
            prompt_lens,
            start_pos,
            empty_slots,
            store,
            per_lane=self.per_lane,
            num_slots=self.max_batch_size,
            max_seq_len=self.max_seq_len,
        )
        prep = (
            prepare_sampling(sampling_params, batch.ends.tolist(), self.config.vocab_size, self.device)
            if sampling_params is not None
            else None
        )
        if self._mirror is not None:
            self._mirror.invalidate(batch.slots)
        order = batch.order()

        def program() -> Any:
            grouped = torch.cat(
                [
                    decoder_forward(self.config, self.weights, self.rope, self.device, store, *batch.group_inputs(g))
                    for g in batch.groups
                ]
            )  # [n, vocab], group order
            logits = torch.empty_like(grouped)
            logits[order.to(grouped.device)] = grouped  # back in the caller's row order
            if prep is None:
                return logits[:, None, :].float().cpu()
            return sample(logits, prep, self.generator, self.model_capabilities[MAX_DEVICE_TOP_K]).as_tt_output()

        return self._queue.run(program)

    # ---- decode ----

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
    ) -> Any:
        """One token for every slot. ``read_from_device=True``: logits ``[B_wire, 1, vocab]``, or
        tokens ``[B_wire]`` / ``(tokens, logprobs)`` with ``sampling_params``; False: a
        ``PendingDecode`` device handle (the forward runs on the device queue)."""
        store = self._store_for(kv_cache)
        # Host snapshots (the engine may reuse its buffers for step N+1 while step N runs), in
        # numpy: this runs on the engine's step thread, where torch ops would give up the GIL
        # (``accel.tt.host_arrays``). Every torch op of the step runs in the program.
        tokens_host = host_copy(tokens, np.int64).reshape(-1, 1)
        start_host = host_copy(start_pos, np.int64).reshape(-1)
        table_host = host_copy(page_table, np.int64)
        if tokens_host.shape[0] != self.max_batch_size or start_host.shape[0] != self.max_batch_size:
            raise ValueError(
                f"decode runs the full slot batch: expected {self.max_batch_size} rows, "
                f"got tokens {tuple(tokens_host.shape)} start_pos {tuple(start_host.shape)}"
            )
        max_end = int(start_host.max()) + 1
        if max_end > self.max_seq_len:
            raise ValueError(f"decode position {max_end - 1} >= max_seq_len {self.max_seq_len}")
        slot_remap = kwargs.get("slot_remap")
        if slot_remap is not None and list(slot_remap) != list(range(len(slot_remap))):
            raise NotImplementedError("TorchMeshModel keeps device state per slot; slot_remap must be the identity")
        ctx_blocks = num_ctx_blocks(max_end, store, table_host.shape[1])
        num_ctx_tokens = round_up(max_end, CTX_TOKEN_ALIGN)
        check_block_ids(table_host, start_host + 1, store)
        prep = (
            self._decode_sampling.prepare(sampling_params, (start_host + 1).tolist())
            if sampling_params is not None
            else None
        )
        mirror = None if self._mirror is None else (self._mirror, self._mirror.plan(start_host, table_host))
        if kwargs.get("rope_deltas_all_users") is not None:  # None: keep the ones given before
            self._rope_deltas = torch.tensor(list(kwargs["rope_deltas_all_users"]), dtype=torch.int64)
        rope_deltas = self._rope_deltas

        def program() -> Any:
            tokens, start, page_table = (torch.from_numpy(a) for a in (tokens_host, start_host, table_host))
            is_written = (start >= 0)[:, None]
            positions = start.clamp_min(0)[:, None]
            # mrope: a slot's next token sits at its position + its request's delta
            cos_sin = None if rope_deltas is None else self.rope.at_rolled((positions[:, 0] + rope_deltas).clamp_min(0))
            logits = decoder_forward(
                self.config,
                self.weights,
                self.rope,
                self.device,
                store,
                tokens,
                positions,
                is_written,
                self._slot_lanes,
                page_table,
                ctx_blocks,
                torch.zeros(self.max_batch_size, dtype=torch.int64),
                num_ctx_tokens,
                mirror,
                cos_sin=cos_sin,
            )
            if prep is None:
                return logits[:, None, :].float().cpu()
            return sample(logits, prep, self.generator, self.model_capabilities[MAX_DEVICE_TOP_K]).as_tt_output()

        pending = PendingDecode(self._queue.submit(program), is_sampled=prep is not None)
        return pending.result() if read_from_device else pending

    def use_host_inputs(self, slots: Sequence[int]) -> None:
        """``slots`` have new occupants (the engine's call at a changed decode batch; see
        ``backend.TtnnMeshModel.use_host_inputs``): their next decode rebuilds its context from the
        paged KV instead of trusting the slot's mirrored one."""
        if self._mirror is not None:
            self._mirror.invalidate(slots)

    def read_decode_output(self, tt_out: Any, async_read: bool = False) -> Any:
        """tt-metal's read-back: ``async_read=True`` -> ``(tt_out, [event])`` (the copy is under
        way; ``tt_out`` is still the device handle); False -> the host output (waits)."""
        if async_read:
            events = [FutureEvent(tt_out.future)] if isinstance(tt_out, PendingDecode) else []
            return tt_out, events
        return tt_out.result() if isinstance(tt_out, PendingDecode) else tt_out

    def process_decode_output_host(self, tt_out: Any, is_tokens: bool = False) -> Any:
        """The read-back handle as host torch tensors, in tt-metal's form (see ``decode_forward``)."""
        if isinstance(tt_out, PendingDecode):
            if is_tokens != tt_out.is_sampled:
                raise ValueError(
                    f"is_tokens={is_tokens} but the decode {'did' if tt_out.is_sampled else 'did not'} sample"
                )
            return tt_out.result()
        return tt_out

    # ---- warmup ("trace capture", ``warmup``) ----

    def warmup_model_prefill(
        self, kv_cache: Any, enable_trace: bool, can_sample_on_device: bool, **kwargs: Any
    ) -> None:
        """Runs every prefill bucket (128 .. max_seq_len) once, batch 1; writes only the scratch block."""
        warm_prefill(self, self._store_for(kv_cache), enable_trace, can_sample_on_device)

    def warmup_model_decode(
        self,
        kv_cache: Any,
        enable_trace: bool,
        max_batch_size: int,
        num_blocks: int,
        can_sample_on_device: bool,
        **kwargs: Any,
    ) -> None:
        """Runs the full-width decode (every slot empty: no KV write) and each sampling variant."""
        warm_decode(self, self._store_for(kv_cache), enable_trace, num_blocks, can_sample_on_device)
