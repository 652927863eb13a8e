"""A tt-metal-style generator for host tests: asserts every call follows the interface our engine
and loader must use (kwarg names, shapes, dtypes, lane layout) and computes a trivial next token
(``(last token + 1) % vocab``), so engine plumbing can be checked without hardware.

Shaped like an *older* tt-metal class: ``initialize_vllm_model`` has no ``optimizations`` keyword,
so the loader must leave it out. Lives in an ``EXTRA_MODELS_DIR`` bundle (``vllm_metadata.json``).
"""

from __future__ import annotations

from typing import Any

import torch
import ttnn


class FakeTTModel:
    model_capabilities = {
        "supports_prefix_caching": True,
        "supports_async_decode": True,
        "supports_sample_on_device": False,
        # Stands for a single-execute generator (Galaxy-style): one instance drives every lane.
        "supports_data_parallel_lanes": True,
    }
    VOCAB = 64
    instances: list[FakeTTModel] = []

    def __init__(self, mesh_device: Any, max_batch_size: int, max_seq_len: int, num_lanes: int) -> None:
        self.mesh_device = mesh_device
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.num_lanes = num_lanes
        self.calls: list[str] = []
        FakeTTModel.instances.append(self)

    @classmethod
    def initialize_vllm_model(
        cls, hf_config, mesh_device, max_batch_size, max_seq_len=131072, n_layers=None, tt_data_parallel=1
    ):
        assert hasattr(hf_config, "architectures"), "hf_config must be an HF config"
        assert isinstance(mesh_device, ttnn.MeshDevice), f"mesh_device is {type(mesh_device)}"
        assert max_batch_size % tt_data_parallel == 0, "max_batch_size is global: lanes x per-lane"
        rows, cols = mesh_device.shape.dims
        assert (rows * cols) % tt_data_parallel == 0, "one submesh per lane"
        mesh_device.create_submeshes(ttnn.MeshShape(1, rows * cols // tt_data_parallel))
        return cls(mesh_device, max_batch_size, max_seq_len, tt_data_parallel)

    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        assert len(kv_cache_shape) == 4, "(num_blocks, kv_heads, block_size, head_dim)"
        self.kv_shape = tuple(kv_cache_shape)
        self.kv_dtype = dtype
        # tt-metal's allocate_vllm_kv_cache starts exactly so (a ttnn dtype raises TypeError here),
        # then converts to ttnn tensors of the model's own KV dtype (bfloat8_b by default).
        cache_kv = torch.zeros(kv_cache_shape, dtype=dtype)
        return [[[cache_kv.clone(), cache_kv.clone()] for _ in range(num_layers)] for _ in range(self.num_lanes)]

    def _check_kv(self, kv_cache) -> None:
        assert len(kv_cache) == self.num_lanes, "kv_cache is [lane][layer] = [K, V]"
        assert all(len(layer) == 2 for lane in kv_cache for layer in lane)

    def _next_token_logits(self, last_tokens: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot((last_tokens.long() + 1) % self.VOCAB, self.VOCAB).float()

    def prefill_forward(
        self,
        tokens,
        page_table,
        kv_cache,
        prompt_lens,
        start_pos=None,
        empty_slots=None,
        sampling_params=None,
        enable_trace=False,
        **kwargs,
    ):
        self.calls.append("prefill")
        n = tokens.shape[0]
        assert tokens.dim() == 2 and page_table.dim() == 2 and page_table.shape[0] == n
        assert page_table.dtype == torch.int32, "page tables are int32"
        assert len(prompt_lens) == n and max(prompt_lens) <= tokens.shape[1]
        assert start_pos is not None and all(0 <= s < e for s, e in zip(start_pos, prompt_lens))
        assert empty_slots is not None and len(empty_slots) == n
        assert all(0 <= s < self.max_batch_size for s in empty_slots), "empty_slots are global slots"
        self._check_kv(kv_cache)
        last = torch.stack([tokens[i, prompt_lens[i] - 1] for i in range(n)])
        return self._next_token_logits(last)[:, None, :]

    def decode_forward(
        self,
        tokens,
        start_pos,
        page_table,
        kv_cache,
        enable_trace=True,
        read_from_device=True,
        sampling_params=None,
        reset_batch=False,
        **kwargs,
    ):
        self.calls.append("decode")
        assert tokens.shape == (self.max_batch_size, 1), "decode runs every slot"
        assert start_pos.shape == (self.max_batch_size,) and page_table.shape[0] == self.max_batch_size
        assert page_table.dtype == torch.int32
        self._check_kv(kv_cache)
        logits = self._next_token_logits(tokens[:, 0])[:, None, :]  # [B, 1, vocab], as tt-metal's
        logits[start_pos < 0] = float("nan")  # empty slots: garbage the engine must ignore
        return ("device", logits) if not read_from_device else logits

    def read_decode_output(self, tt_out, async_read=False):
        assert isinstance(tt_out, tuple) and tt_out[0] == "device"
        if not async_read:
            return tt_out[1]
        return ("host", tt_out[1]), [ttnn.record_event(self.mesh_device, 0)]

    def process_decode_output_host(self, tt_out, is_tokens=False):
        assert isinstance(tt_out, tuple) and tt_out[0] == "host"
        return tt_out[1]

    def warmup_model_prefill(self, kv_cache, enable_trace, can_sample_on_device):
        self.calls.append("warmup_prefill")

    def warmup_model_decode(self, kv_cache, enable_trace, max_batch_size, num_blocks, can_sample_on_device):
        assert max_batch_size == self.max_batch_size
        self.calls.append("warmup_decode")
