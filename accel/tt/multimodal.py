"""Images on the TT mesh engine: vllm-tt-plugin's multimodal contract with the vision classes.

What the plugin does (``model_runner.py`` at vllm-tt-plugin e3fc849: ``_gather_multi_modal_inputs``,
``submit_prefill``; ``async_decode.py``), and so what the runner does:
- a prefill step of a multimodal class passes ``pixel_values`` and ``image_grid_thw``: lists with
  one entry per prefill row, None for a text-only row, else that request's list of images
  (one tensor each). Images only; decode steps pass neither.
- a class with multimodal rotary positions (mrope) returns ``(logits, rope_deltas)`` from
  ``prefill_forward``; ``rope_deltas[i]`` belongs to prefill row ``i`` and is kept per request
  (the plugin's ``mrope_position_delta``). Every decode passes ``rope_deltas_all_users``: the
  delta of each decode row (here: each slot, 0 for an empty one) when the batch holds a request
  the previous decode did not, else None (the model keeps what it was given).

The gates the classes impose (``VisionTraits``), read from tt-metal's generators
(``models/demos/qwen25_vl/tt/generator_vllm.py`` at b589652d6297a1e614164a2927bfa5cbac5faba8,
``models/demos/qwen3_vl/tt/generator_vllm.py`` at 1d1ec00206d670c05ec43719a52b0d3de7015de5):
- neither declares ``supports_prefix_caching`` and both assert ``start_pos == 0``: no prefix hits;
- both processing infos allow one image per prompt (``{"image": 1, "video": 0}``);
- both look only at row 0's ``pixel_values`` to decide whether a prefill has images ("we
  currently do not support mixed inputs of text-only users and text-image users"): text-only
  and image rows go to separate prefill steps.
A class of ours declares the same facts in ``model_capabilities`` (keys below); an upstream
class that does not is looked up by name in ``UPSTREAM_VISION_TRAITS``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from accel.contract import ConfigError

# Our own ``model_capabilities`` keys (tt-metal has none for these facts).
IS_MULTIMODAL = "is_multimodal"  # bool: prefill takes pixel_values / image_grid_thw
USES_MROPE = "uses_mrope"  # bool: prefill returns (logits, rope_deltas)
MAX_IMAGES_PER_REQUEST = "max_images_per_request"  # int; absent = no limit
MIXES_TEXT_AND_IMAGE_ROWS = "mixes_text_and_image_rows"  # bool; absent = False (the upstream rule)


@dataclass(frozen=True)
class ImageInput:
    """One image as the HF processor left it on the host (vLLM's ``pixel_values`` and
    ``image_grid_thw`` items): ``pixel_values`` float ``[num_patches, C * T * P * P]``,
    ``image_grid_thw`` int64 ``[1, 3]`` (temporal, height, width patches)."""

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor

    @property
    def num_tokens(self) -> int:
        """Placeholder tokens the image takes in the prompt, for a spatial merge of 2x2."""
        return int(self.image_grid_thw.prod()) // 4


@dataclass(frozen=True)
class VisionTraits:
    is_multimodal: bool = False
    uses_mrope: bool = False
    max_images_per_request: int | None = None  # None: no limit
    mixes_text_and_image_rows: bool = False


TEXT_ONLY = VisionTraits()

_QWEN_VL = VisionTraits(is_multimodal=True, uses_mrope=True, max_images_per_request=1)
# tt-metal generator class name -> its traits (revisions in the module docstring; both
# processing infos answer ``{"image": 1, "video": 0}``).
UPSTREAM_VISION_TRAITS: Mapping[str, VisionTraits] = {
    "Qwen2_5_VLForConditionalGeneration": _QWEN_VL,
    "Qwen3VLForConditionalGeneration": _QWEN_VL,
}


# Vision classes the engine cannot drive, by tt-metal class name, with why (a ConfigError at build).
UNSUPPORTED_VISION_CLASSES: Mapping[str, str] = {
    # tt-metal models/tt_transformers/tt/generator_vllm.py at 4d4a062913c5f5273ce33ce93fc7f2bb6543166c:
    # an encoder-decoder class on vLLM V0's INPUT_REGISTRY, prefill_forward(tokens, images,
    # page_table, kv_cache, prompt_lens, cross_page_table); vllm-tt-plugin e3fc849 refuses
    # encoder-decoder models ("Encoder-decoder models aren't yet supported for TT").
    "MllamaForConditionalGeneration": "Llama 3.2 Vision's tt-metal class is encoder-decoder (V0 only: "
    "cross-attention page tables, PIL images to prefill_forward); vllm-tt-plugin does not serve it either",
}


def check_supported(model_cls: Any) -> None:
    """Raise ``ConfigError`` naming a class in ``UNSUPPORTED_VISION_CLASSES``."""
    reason = UNSUPPORTED_VISION_CLASSES.get(getattr(model_cls, "__name__", ""))
    if reason is not None:
        raise ConfigError(f"model: {model_cls.__name__} is not supported on the TT mesh engine: {reason}")


def vision_traits(model_cls: Any) -> VisionTraits:
    """The class's declared traits (``model_capabilities``), else the upstream table, else
    text-only (images refused)."""
    caps: Mapping[str, Any] = getattr(model_cls, "model_capabilities", None) or {}
    if caps.get(IS_MULTIMODAL, False):
        limit = caps.get(MAX_IMAGES_PER_REQUEST)
        return VisionTraits(
            is_multimodal=True,
            uses_mrope=bool(caps.get(USES_MROPE, False)),
            max_images_per_request=None if limit is None else int(limit),
            mixes_text_and_image_rows=bool(caps.get(MIXES_TEXT_AND_IMAGE_ROWS, False)),
        )
    return UPSTREAM_VISION_TRAITS.get(getattr(model_cls, "__name__", ""), TEXT_ONLY)


def prefill_image_kwargs(rows: Sequence[Any]) -> dict[str, list[list[torch.Tensor] | None]]:
    """The plugin's per-row lists for ``prefill_forward`` over plan rows (``RowPlan.images``)."""
    pixel_values: list[list[torch.Tensor] | None] = []
    grids: list[list[torch.Tensor] | None] = []
    for r in rows:
        if not r.images:
            pixel_values.append(None)
            grids.append(None)
            continue
        pixel_values.append([image.pixel_values for image in r.images])
        grids.append([image.image_grid_thw for image in r.images])
    return {"pixel_values": pixel_values, "image_grid_thw": grids}


def split_prefill_output(out: Any) -> tuple[Any, list[int]]:
    """An mrope class's ``(logits, rope_deltas)`` -> the model output and one int per row."""
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(f"an mrope model's prefill must return (logits, rope_deltas), got {type(out).__name__}")
    output, deltas = out
    return output, [int(torch.as_tensor(d).reshape(-1)[0]) for d in deltas]


class RopeDeltas:
    """Each request's mrope position delta, from the prefill that computed its prompt (the
    plugin's ``mrope_position_delta``), and the per-slot list a decode sends."""

    def __init__(self) -> None:
        self._by_request: dict[str, int] = {}

    def store(self, rows: Sequence[Any], deltas: Sequence[int]) -> None:
        """``deltas[i]`` of prefill row ``rows[i]`` (``RowPlan``s)."""
        self._by_request.update((r.req_id, d) for r, d in zip(rows, deltas))

    def drop(self, req_id: str) -> None:
        self._by_request.pop(req_id, None)

    def get(self, req_id: str) -> int | None:
        return self._by_request.get(req_id)

    def by_slot(self, layout: Sequence[tuple[int, str]], capacity: int) -> list[int]:
        """One delta per decode row (``layout``: ``(row, req_id)``; 0 where a slot is empty),
        sent when the batch changed, as the plugin sends its rows' deltas when a request joined
        (None otherwise: the model keeps the ones it has)."""
        deltas = [0] * capacity
        for row, req_id in layout:
            deltas[row] = self._by_request.get(req_id, 0)
        return deltas
