"""``TorchQwen25VLMeshModel``: the torch mesh program for Qwen2.5-VL, on the vision classes' contract.

The text decoder is the torch program's own (``decoder_forward`` over paged, lane-local KV; the
checkpoint's ``model.language_model.*`` tensors); the vision tower is transformers' own
``Qwen2_5_VisionTransformerPretrainedModel`` (``model.visual.*``), and the 3-D rotary positions
come from transformers' own ``get_rope_index``. As tt-metal's vision generators:
- ``prefill_forward(..., pixel_values=, image_grid_thw=)`` takes the plugin's per-row lists (None
  for a text row) and returns ``(logits [n, 1, vocab], rope_deltas [n, 1])``; every ``start_pos``
  must be 0 (no prefix caching, no chunked prefill);
- ``decode_forward(..., rope_deltas_all_users=)`` rotates each slot's token at ``start_pos +
  delta`` (``TorchMeshModel.decode_forward``); its KV position stays ``start_pos``.
Unlike them it takes text-only and image rows in one prefill, and any number of images per row.
Prefill runs row by row at the row's own length (no buckets): the image rows' shapes differ anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from accel.tt.host_arrays import host_copy
from accel.tt.mesh_model import SUPPORTS_ASYNC_DECODE
from accel.tt.multimodal import IS_MULTIMODAL, MIXES_TEXT_AND_IMAGE_ROWS, USES_MROPE
from accel.tt.torch_model.decoder import decoder_forward
from accel.tt.torch_model.layers import RotaryTables
from accel.tt.torch_model.model import TorchMeshModel
from accel.tt.torch_model.paged_attention import check_block_ids, num_ctx_blocks
from accel.tt.torch_model.warmup import CTX_TOKEN_ALIGN, round_up
from accel.tt.torch_model.weights import read_tensors

# The vision tower's tensors: ``visual.`` in the published checkpoints and transformers 5's save,
# ``model.visual.`` under transformers' module names.
VISUAL_PREFIXES = ("visual.", "model.visual.")


class TorchQwen25VLMeshModel(TorchMeshModel):
    model_capabilities: ClassVar[dict[str, Any]] = {
        SUPPORTS_ASYNC_DECODE: True,
        IS_MULTIMODAL: True,
        USES_MROPE: True,
        MIXES_TEXT_AND_IMAGE_ROWS: True,
    }

    visual: Any = None  # transformers' vision tower, set by initialize_vllm_model
    hf_config: Any = None

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
    ) -> TorchQwen25VLMeshModel:
        model = super().initialize_vllm_model(
            hf_config,
            mesh_device,
            max_batch_size,
            max_seq_len,
            n_layers,
            tt_data_parallel,
            optimizations,
            checkpoint_dir,
        )
        assert isinstance(model, TorchQwen25VLMeshModel)
        model.attach_vision(hf_config, Path(checkpoint_dir or hf_config._name_or_path))
        return model

    def attach_vision(self, hf_config: Any, model_dir: Path) -> None:
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (  # deferred: the torch VLM only
            Qwen2_5_VisionTransformerPretrainedModel,
        )

        visual = Qwen2_5_VisionTransformerPretrainedModel._from_config(  # type: ignore[no-untyped-call]
            hf_config.vision_config, dtype=self.dtype
        )
        tensors = read_tensors(model_dir)
        prefix = next(p for p in VISUAL_PREFIXES if any(k.startswith(p) for k in tensors))
        state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        visual.load_state_dict(state, strict=True)
        self.visual = visual.eval().to(self.device)
        self.hf_config = hf_config

    # ---- prefill ----

    def prefill_forward(
        self,
        tokens: Any,
        page_table: Any,
        kv_cache: Any,
        prompt_lens: Sequence[int],
        start_pos: Sequence[int] | None = None,
        empty_slots: Sequence[int] | None = None,
        sampling_params: Any = None,
        enable_trace: bool = False,
        pixel_values: Sequence[Sequence[torch.Tensor] | None] | None = None,
        image_grid_thw: Sequence[Sequence[torch.Tensor] | None] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Each row's ``tokens[i, :prompt_lens[i]]`` -> ``(logits [n, 1, vocab], rope_deltas [n, 1])``."""
        if sampling_params is not None:
            raise ValueError("TorchQwen25VLMeshModel samples on the host (no supports_sample_on_device)")
        store = self._store_for(kv_cache)
        tokens_host = host_copy(tokens, np.int64)
        table = host_copy(page_table, np.int64)
        n = tokens_host.shape[0]
        ends = [int(e) for e in prompt_lens]
        if start_pos is not None and any(int(s) != 0 for s in start_pos):
            raise ValueError(f"prefix caching is not supported for Qwen2.5-VL, got start_pos: {list(start_pos)}")
        slots = list(range(n)) if empty_slots is None else [int(s) for s in empty_slots]
        check_block_ids(table, np.array(ends, dtype=np.int64), store)
        if self._mirror is not None:
            self._mirror.invalidate(slots)
        images = [_row_images(pixel_values, image_grid_thw, i) for i in range(n)]

        def program() -> Any:
            logits, deltas = [], []
            for i in range(n):
                row_logits, delta = self._prefill_row(store, tokens_host[i, : ends[i]], table[i], slots[i], images[i])
                logits.append(row_logits)
                deltas.append(delta)
            return torch.cat(logits)[:, None, :].float().cpu(), torch.tensor(deltas, dtype=torch.int64)[:, None]

        return self._queue.run(program)

    @torch.inference_mode()
    def _prefill_row(
        self, store: Any, ids_host: np.ndarray, table_row: np.ndarray, slot: int, image: Any
    ) -> tuple[torch.Tensor, int]:
        ids = torch.from_numpy(ids_host)
        length = ids.shape[0]
        embeds, cos_sin, delta = self._row_inputs(ids, image)
        logits = decoder_forward(
            self.config,
            self.weights,
            self.rope,
            self.device,
            store,
            ids[None],
            torch.arange(length)[None],
            torch.ones(1, length, dtype=torch.bool),
            self._slot_lanes[slot : slot + 1],
            torch.from_numpy(table_row[None]),
            num_ctx_blocks(length, store, table_row.shape[0]),
            torch.tensor([length - 1]),
            round_up(length, CTX_TOKEN_ALIGN),
            embeds=embeds,
            cos_sin=cos_sin,
        )
        return logits, delta

    def _row_inputs(self, ids: torch.Tensor, image: Any) -> tuple[torch.Tensor | None, Any, int]:
        """Input embeddings with the image features at the image tokens, the multimodal rotary
        tables, and the row's rope delta; for a text row none of them (plain positions, delta 0)."""
        if image is None:
            return None, None, 0
        pixels, grid = image
        features = self.visual(pixels.to(device=self.device, dtype=self.dtype), grid_thw=grid.to(self.device))
        is_image = ids == int(self.hf_config.image_token_id)
        embeds = self.weights.embed[ids.to(self.device)].clone()
        embeds[is_image.to(self.device)] = features.pooler_output.to(embeds.dtype)
        positions, delta = _QwenRopeIndex(self.hf_config).get_rope_index(
            ids[None], mm_token_type_ids=is_image[None].int(), image_grid_thw=grid
        )
        section = list(self.hf_config.get_text_config().rope_parameters["mrope_section"])
        return embeds, mrope_tables(self.rope, positions[:, 0].to(self.device), section), int(delta.reshape(-1)[0])


def mrope_tables(
    rope: RotaryTables, positions: torch.Tensor, section: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rolled cos / signed sin ``[L, 1, D]`` for 3-D positions ``[3, L]`` (temporal, height,
    width): frequency section ``i`` of the half dimension takes axis ``i % 3``'s position (HF's
    ``recomposition_frequencies``), both halves alike."""
    half = rope.cos.shape[-1] // 2
    offsets = np.cumsum([0, *section[:-1]]).tolist()
    cos = torch.cat([rope.cos[positions[i % 3], o : o + s] for i, (o, s) in enumerate(zip(offsets, section))], -1)
    sin = torch.cat([rope.sin[positions[i % 3], o : o + s] for i, (o, s) in enumerate(zip(offsets, section))], -1)
    assert cos.shape[-1] == half, f"mrope_section {list(section)} does not cover half the head dim {half}"
    return torch.cat((cos, cos), -1)[:, None, :], torch.cat((-sin, sin), -1)[:, None, :]


def _row_images(pixel_values: Any, grids: Any, i: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    if pixel_values is None or pixel_values[i] is None:
        return None
    return torch.cat(list(pixel_values[i])), torch.cat(list(grids[i]))


class _QwenRopeIndex:
    """transformers' own ``Qwen2_5_VLModel.get_rope_index`` over the checkpoint's config, without
    building the model it is a method of (it reads only ``config`` and this helper)."""

    def __init__(self, config: Any) -> None:
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel  # deferred: the torch VLM

        self.config = config
        self._model_cls: Any = Qwen2_5_VLModel

    def get_rope_index(self, *args: Any, **kwargs: Any) -> Any:
        return self._model_cls.get_rope_index(self, *args, **kwargs)

    def get_vision_position_ids(self, *args: Any, **kwargs: Any) -> Any:
        return self._model_cls.get_vision_position_ids(self, *args, **kwargs)
