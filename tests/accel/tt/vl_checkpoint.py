"""A tiny Qwen2.5-VL checkpoint for the TT engine's image tests, built into a test folder, with
images and HF's greedy reference for it.

Until ``accel.models`` ships the project's tiny vision-language checkpoint, the tests build one
here: ``Qwen2_5_VLForConditionalGeneration`` with a small config and seeded random weights with a
large spread (peaked logits: greedy comparisons are token-exact), the tiny Qwen3 checkpoint's
tokenizer (vocabulary 1024; its last four ids serve as the vision tokens). Images are random
``pixel_values`` of a given patch grid, as the HF image processor would hand them over.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import torch

from accel.tt.multimodal import ImageInput

VOCAB_SIZE = 1024
IMAGE_TOKEN_ID, VIDEO_TOKEN_ID, VISION_START_ID, VISION_END_ID = 1020, 1021, 1022, 1023
PATCH_DIM = 3 * 2 * 14 * 14  # channels x temporal patch x patch x patch
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja")


def build_tiny_vl(out_dir: Path, tokenizer_dir: Path) -> Path:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=VOCAB_SIZE,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            initializer_range=0.15,
            bos_token_id=None,
            eos_token_id=1,
            tie_word_embeddings=False,
        ),
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=56,
            fullatt_block_indexes=[1],
            initializer_range=0.15,
        ),
        image_token_id=IMAGE_TOKEN_ID,
        video_token_id=VIDEO_TOKEN_ID,
        vision_start_token_id=VISION_START_ID,
        vision_end_token_id=VISION_END_ID,
        tie_word_embeddings=False,
    )
    torch.manual_seed(40)
    model = Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, out_dir / name)
    return out_dir


def image(seed: int, grid: tuple[int, int, int] = (1, 4, 4)) -> ImageInput:
    """Random pixel values of a ``grid`` of patches (t, h, w)."""
    gen = torch.Generator().manual_seed(seed)
    num_patches = grid[0] * grid[1] * grid[2]
    return ImageInput(torch.randn(num_patches, PATCH_DIM, generator=gen), torch.tensor([list(grid)]))


def image_prompt(text_before: Sequence[int], img: ImageInput, text_after: Sequence[int]) -> tuple[int, ...]:
    """Text, then the image's placeholders between the vision tokens, then text."""
    pads = [IMAGE_TOKEN_ID] * img.num_tokens
    return (*text_before, VISION_START_ID, *pads, VISION_END_ID, *text_after)


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
            mm_token_type_ids=(ids == IMAGE_TOKEN_ID).int(),
        )
    # No eos: the engine runs with ignore_eos, and min_new_tokens would mask eos instead.
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        out = model.generate(input_ids=ids, generation_config=config, **extra)
    return out[0, ids.shape[1] :].tolist()
