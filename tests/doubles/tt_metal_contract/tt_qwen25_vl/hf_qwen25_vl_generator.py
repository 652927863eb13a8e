"""tt-metal's Qwen2.5-VL vLLM generator, for host tests: its call contract, HF's numbers.

Written from tt-metal ``models/demos/qwen25_vl/tt/generator_vllm.py`` at
b589652d6297a1e614164a2927bfa5cbac5faba8, read (never copied) through the code-search store, as
vllm-tt-plugin e3fc849 drives it (``model_runner._gather_multi_modal_inputs`` / ``submit_prefill``,
``async_decode``'s ``rope_deltas_all_users``). What that revision's class does and this double
keeps:
- the class name ``Qwen2_5_VLForConditionalGeneration``; ``model_capabilities`` declares only
  ``supports_prefix_caching: False`` (no async decode, no device sampling: host logits);
- ``initialize_vllm_model(hf_config, mesh_device, max_batch_size, max_seq_len, tt_data_parallel=1,
  optimizations=None)``, asserting ``optimizations is None``;
- ``allocate_kv_cache(kv_cache_shape, dtype, num_layers)`` returning one ``[K, V]`` per layer
  (``allocate_vllm_kv_cache``: ``torch.zeros(kv_cache_shape, dtype=dtype)`` per K and V);
- ``prefill_forward(tokens, page_table, kv_cache, prompt_lens, enable_trace, **kwargs)``:
  asserts every ``start_pos`` is 0 (no prefix caching); ``pixel_values`` / ``image_grid_thw``
  are per-row lists (None for a text row, else the row's images); only row 0 decides whether
  the step has images ("we currently do not support mixed inputs of text-only users and
  text-image users"): upstream then ignores a later row's images, or fails on a later text row.
  The double raises on both, so an engine that mixes them fails loudly. One image per request
  (``TT_Qwen2_5_VLProcessingInfo``: ``{"image": 1, "video": 0}``), asserted here too. Returns
  ``(logits [n, 1, vocab], rope_deltas [n, 1])``;
- ``decode_forward(*args, **kwargs)`` pops ``rope_deltas_all_users`` (None: keep the deltas it has;
  else one per decode row: ``update_rope_deltas``) and runs ``decode_forward_text(tokens, start_pos,
  page_table, kv_cache, enable_trace, read_from_device, ...)``; the device output is read back with
  ``read_decode_output`` / ``process_decode_output_host`` (the shared ``Generator``'s).
Warmup is not part of this revision's class (the engine runs it with warmup off).

The numbers are HF transformers' (fp32), recomputed from each row's context as the KV cache holds
it (the token id in K, a written-marker in V, layer 0; the image by the row's first block, where
its embeddings would be). A decode token's rotary position is ``start_pos + rope_delta`` of its
slot, the delta the engine handed back in ``rope_deltas_all_users``: an engine that loses or
mixes up the deltas decodes at the wrong positions and leaves HF's greedy path.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import ttnn


class _DeviceTensor:
    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


class _HostTensor:
    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


class Qwen2_5_VLForConditionalGeneration:  # noqa: N801 (tt-metal's class name)
    model_capabilities: ClassVar[dict[str, Any]] = {"supports_prefix_caching": False}
    instances: ClassVar[list[Qwen2_5_VLForConditionalGeneration]] = []

    def __init__(self, hf_model: Any, mesh_device: Any, max_batch_size: int) -> None:
        self.hf_model = hf_model
        self.mesh_device = mesh_device
        self.max_batch_size = max_batch_size
        self.vocab_size = int(hf_model.config.text_config.vocab_size)
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.kv_cache: Any = None
        self._rope_deltas: list[int | None] = [None] * max_batch_size  # per decode row (update_rope_deltas)
        # first block of a prefilled row -> (its image or None, the prefill's length)
        self._prefilled: dict[int, tuple[Any, int]] = {}
        Qwen2_5_VLForConditionalGeneration.instances.append(self)

    @classmethod
    def initialize_vllm_model(
        cls, hf_config, mesh_device, max_batch_size, max_seq_len, tt_data_parallel=1, optimizations=None
    ):
        from transformers import Qwen2_5_VLForConditionalGeneration as HFModel

        assert optimizations is None, "Custom optimizations are not supported for this model"
        assert isinstance(mesh_device, ttnn.MeshDevice), f"mesh_device is {type(mesh_device).__name__}"
        hf_model = HFModel.from_pretrained(hf_config._name_or_path, dtype=torch.float32).eval()
        return cls(hf_model, mesh_device, max_batch_size)

    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        self.calls.append(("allocate_kv_cache", {"kv_cache_shape": kv_cache_shape, "dtype": dtype}))
        self.kv_cache = [[torch.zeros(kv_cache_shape, dtype=dtype) for _ in "kv"] for _ in range(num_layers)]
        return self.kv_cache

    # ---- prefill ----
    def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens, enable_trace, **kwargs):
        start_pos = kwargs.get("start_pos", None)
        assert (start_pos is None) or all(x == 0 for x in start_pos), (
            f"Prefix caching is not supported for Qwen2_5_VL, got start_pos: {start_pos}"
        )
        n = tokens.shape[0]
        pixel_values = kwargs.get("pixel_values") or [None] * n
        grids = kwargs.get("image_grid_thw") or [None] * n
        has_images = [pv is not None for pv in pixel_values]
        assert len(set(has_images)) <= 1, f"mixed text-only and image rows in one prefill: {has_images}"
        assert all(pv is None or len(pv) == 1 for pv in pixel_values), "only 1 image per request"
        self.calls.append(("prefill", {"has_images": has_images, "start_pos": start_pos}))
        rows, deltas = [], []
        for i in range(n):
            seq_len, blocks = int(prompt_lens[i]), page_table[i].tolist()
            context = tokens[i, :seq_len].tolist()
            for pos, token in enumerate(context):
                self._write_kv(blocks, pos, token)
            image = None if pixel_values[i] is None else (pixel_values[i][0], grids[i][0])
            self._prefilled[int(blocks[0])] = (image, seq_len)
            logits, delta = self._prompt_logits(context, image)
            rows.append(logits)
            deltas.append(delta)
        return torch.stack(rows)[:, None, :], torch.tensor(deltas, dtype=torch.int64)[:, None]

    # ---- decode ----
    def decode_forward(self, *args, **kwargs):
        rope_deltas_list = kwargs.pop("rope_deltas_all_users", None)
        self.calls.append(("decode", {"rope_deltas_all_users": rope_deltas_list}))
        if rope_deltas_list is not None:
            self.update_rope_deltas(rope_deltas_list)
        return self.decode_forward_text(*args, **kwargs)

    def update_rope_deltas(self, rope_deltas_list):
        assert len(rope_deltas_list) == self.max_batch_size, "one rope delta per decode row"
        self._rope_deltas = [int(d) for d in rope_deltas_list]

    def decode_forward_text(
        self, tokens, start_pos, page_table=None, kv_cache=None, enable_trace=True, read_from_device=True, **kwargs
    ):
        assert "sampling_params" not in kwargs, "this class does not sample on device"
        logits = torch.zeros(tokens.shape[0], 1, self.vocab_size)
        for row, pos in enumerate(int(p) for p in start_pos.tolist()):
            if pos < 0:
                continue  # empty slot
            blocks = page_table[row].tolist()
            self._write_kv(blocks, pos, int(tokens[row, 0]))
            delta = self._rope_deltas[row]
            assert delta is not None, f"decode row {row}: no rope delta was ever given for it"
            image, num_prefilled = self._prefilled[int(blocks[0])]
            logits[row, 0] = self._decode_logits(self._read_kv(blocks, pos + 1), image, num_prefilled, delta)
        out = _DeviceTensor(logits)
        if read_from_device:
            return self.process_decode_output_host(self.read_decode_output(out))
        return out

    def read_decode_output(self, tt_out, async_read=False):
        assert isinstance(tt_out, _DeviceTensor), f"read_decode_output got {type(tt_out).__name__}"
        host = _HostTensor(tt_out.value)
        if async_read:
            return host, [ttnn.record_event(self.mesh_device, 0)]
        return host

    def process_decode_output_host(self, tt_out, is_tokens=False):
        assert isinstance(tt_out, (_HostTensor, _DeviceTensor)), f"process_decode_output_host got {type(tt_out)}"
        assert not is_tokens
        return tt_out.value

    # ---- internals ----
    def _cell(self, blocks: list[int], pos: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        keys, values = self.kv_cache[0]
        block_size = keys.shape[2]
        return keys, values, int(blocks[pos // block_size]), pos % block_size

    def _write_kv(self, blocks: list[int], pos: int, token: int) -> None:
        keys, values, block, offset = self._cell(blocks, pos)
        keys[block, 0, offset, 0], keys[block, 0, offset, 1] = divmod(int(token), 256)
        values[block, 0, offset, 0] = 1.0

    def _read_kv(self, blocks: list[int], num_tokens: int) -> list[int]:
        out = []
        for pos in range(num_tokens):
            keys, values, block, offset = self._cell(blocks, pos)
            assert values[block, 0, offset, 0] == 1.0, f"position {pos} (block {block}) was never written"
            out.append(int(keys[block, 0, offset, 0]) * 256 + int(keys[block, 0, offset, 1]))
        return out

    def _mm_inputs(self, token_ids: list[int], image: Any) -> dict[str, Any]:
        ids = torch.tensor([token_ids])
        if image is None:
            return {"input_ids": ids}
        mm_types = (ids == self.hf_model.config.image_token_id).int()
        return {"input_ids": ids, "pixel_values": image[0], "image_grid_thw": image[1], "mm_token_type_ids": mm_types}

    @torch.no_grad()
    def _prompt_logits(self, token_ids: list[int], image: Any) -> tuple[torch.Tensor, int]:
        inputs = self._mm_inputs(token_ids, image)
        logits = self.hf_model(**inputs).logits[0, -1].float()
        if image is None:
            return logits, 0
        _, delta = self.hf_model.model.get_rope_index(
            inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"], image_grid_thw=image[1]
        )
        return logits, int(delta.reshape(-1)[0])

    @torch.no_grad()
    def _decode_logits(self, token_ids: list[int], image: Any, num_prefilled: int, delta: int) -> torch.Tensor:
        """The last token's logits: the prefilled tokens at their multimodal positions, each
        decoded one at ``position + delta`` (the engine's delta for the row)."""
        inputs = self._mm_inputs(token_ids, image)
        positions = torch.arange(len(token_ids)).view(1, 1, -1).repeat(3, 1, 1)
        if image is not None:
            prefill_ids = inputs["input_ids"][:, :num_prefilled]
            positions[:, :, :num_prefilled], _ = self.hf_model.model.get_rope_index(
                prefill_ids, mm_token_type_ids=inputs["mm_token_type_ids"][:, :num_prefilled], image_grid_thw=image[1]
            )
        positions[:, :, num_prefilled:] += delta
        return self.hf_model(**inputs, position_ids=positions).logits[0, -1].float()
