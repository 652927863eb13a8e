"""The vision classes' traits and the plugin's per-row multimodal arguments."""

from __future__ import annotations

import pytest
import torch

from accel.tt.multimodal import (
    IS_MULTIMODAL,
    MAX_IMAGES_PER_REQUEST,
    MIXES_TEXT_AND_IMAGE_ROWS,
    TEXT_ONLY,
    USES_MROPE,
    ImageInput,
    VisionTraits,
    prefill_image_kwargs,
    split_prefill_output,
    vision_traits,
)
from accel.tt.registry import builtin_models
from accel.tt.step_plan import RowPlan


class Qwen2_5_VLForConditionalGeneration:  # noqa: N801 (named like tt-metal's class, undeclared)
    model_capabilities = {"supports_prefix_caching": False}


class DeclaresItsTraits:
    model_capabilities = {
        IS_MULTIMODAL: True,
        USES_MROPE: True,
        MAX_IMAGES_PER_REQUEST: 2,
        MIXES_TEXT_AND_IMAGE_ROWS: True,
    }


class TextModel:
    model_capabilities = {"supports_prefix_caching": True}


def test_traits_come_from_the_class_or_the_upstream_table():
    assert vision_traits(Qwen2_5_VLForConditionalGeneration) == VisionTraits(True, True, 1, False)
    assert vision_traits(DeclaresItsTraits) == VisionTraits(True, True, 2, True)
    assert vision_traits(TextModel) is TEXT_ONLY


def test_every_upstream_vision_class_is_registered_under_its_tt_name():
    registered = {entry.tt_arch: entry.ttnn_class for entry in builtin_models()}
    for tt_arch, class_name in [
        ("TTQwen2_5_VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration"),
        ("TTQwen3VLForConditionalGeneration", "Qwen3VLForConditionalGeneration"),
    ]:
        assert registered[tt_arch].endswith(":" + class_name)
        assert vision_traits(type(class_name, (), {})).uses_mrope  # the table knows it by that name


def _row(req_id: str, images: tuple[ImageInput, ...] | None) -> RowPlan:
    return RowPlan(req_id, 0, 0, 0, 4, (1, 2, 3, 4), (0,), True, None, 0, images=images)  # type: ignore[arg-type]


def test_prefill_kwargs_are_one_entry_per_row_none_for_text():
    img = ImageInput(torch.ones(16, 8), torch.tensor([[1, 4, 4]]))
    kwargs = prefill_image_kwargs([_row("text", None), _row("image", (img,))])
    assert kwargs["pixel_values"][0] is None and kwargs["image_grid_thw"][0] is None
    assert kwargs["pixel_values"][1][0] is img.pixel_values and kwargs["image_grid_thw"][1][0] is img.image_grid_thw
    assert img.num_tokens == 4  # 16 patches, merged 2x2


def test_an_mrope_prefill_returns_logits_and_one_delta_per_row():
    logits = torch.zeros(2, 1, 10)
    out, deltas = split_prefill_output((logits, torch.tensor([[-3], [0]])))
    assert out is logits and deltas == [-3, 0]
    with pytest.raises(TypeError, match="logits, rope_deltas"):
        split_prefill_output(logits)


def test_llama_3_2_vision_is_refused_by_name():
    from accel.contract import ConfigError
    from accel.tt.multimodal import check_supported

    mllama = type("MllamaForConditionalGeneration", (), {})
    with pytest.raises(ConfigError, match="MllamaForConditionalGeneration.*encoder-decoder"):
        check_supported(mllama)
    check_supported(Qwen2_5_VLForConditionalGeneration)  # the others pass


def test_rope_deltas_are_kept_per_request_and_sent_per_slot():
    from accel.tt.multimodal import RopeDeltas

    deltas = RopeDeltas()
    deltas.store([_row("a", None), _row("b", None)], [-5, 0])
    assert deltas.by_slot([(3, "a"), (1, "b")], 4) == [0, 0, 0, -5]
    deltas.drop("a")
    assert deltas.get("a") is None and deltas.by_slot([(3, "a")], 4) == [0, 0, 0, 0]
