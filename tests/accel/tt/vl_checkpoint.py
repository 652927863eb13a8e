"""Images and prompts for the TT engine's image tests on the tiny Qwen2.5-VL checkpoint
(``accel/models/tiny_vl.py``; fixture ``tiny_qwen25_vl``), and HF's greedy reference for them.

An image here is random ``pixel_values`` of a given patch grid, as the HF image processor hands
them over (``test_image_processing`` starts from PIL images instead); a prompt is token ids with
the image's placeholders between the vision tokens, the ids read from the checkpoint's config.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from accel.tt.multimodal import ImageInput

PATCH_DIM = 3 * 2 * 14 * 14  # channels x temporal patch x patch x patch (the checkpoint's vision config)


def vision_token_ids(model_dir: Path) -> tuple[int, int, int]:
    """(vision start, image placeholder, vision end)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return config["vision_start_token_id"], config["image_token_id"], config["vision_end_token_id"]


def image(seed: int, grid: tuple[int, int, int] = (1, 4, 4)) -> ImageInput:
    """Random pixel values of a ``grid`` of patches (t, h, w)."""
    gen = torch.Generator().manual_seed(seed)
    num_patches = grid[0] * grid[1] * grid[2]
    return ImageInput(torch.randn(num_patches, PATCH_DIM, generator=gen), torch.tensor([list(grid)]))


def image_prompt(
    model_dir: Path, text_before: Sequence[int], img: ImageInput, text_after: Sequence[int]
) -> tuple[int, ...]:
    """Text, then the image's placeholders between the vision tokens, then text."""
    start, pad, end = vision_token_ids(model_dir)
    return (*text_before, start, *[pad] * img.num_tokens, end, *text_after)


def hf_greedy_vl(model_dir: Path, prompt: Sequence[int], img: ImageInput | None, max_new_tokens: int) -> list[int]:
    """HF's own greedy generation (KV cache, its rope deltas), eos ignored."""
    from transformers import GenerationConfig, Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([list(prompt)])
    extra = {}
    if img is not None:
        extra = dict(
            pixel_values=img.pixel_values,
            image_grid_thw=img.image_grid_thw,
            mm_token_type_ids=(ids == vision_token_ids(model_dir)[1]).int(),
        )
    # No eos: the engine runs with ignore_eos, and min_new_tokens would mask eos instead.
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        out = model.generate(input_ids=ids, generation_config=config, **extra)
    return out[0, ids.shape[1] :].tolist()
