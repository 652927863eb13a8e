"""Where a chat's images sit in its prompt before the engine expands them: the
``accel.block_hash.ImageSlot`` of each, from which the prompt's block hashes key every block from
the first image on by the images' content hashes.

The chat template renders each image as the checkpoint's image placeholder token (its
``config.json`` ``image_token_id``, or ``image_token_index`` in older configs: Idefics3's
``<image>``, Qwen2.5-VL's ``<|image_pad|>``); vLLM's processor replaces each with the image's
tokens from that position on, so the text before it is the engine's too. A template that renders
something else (one token per image is not found), or a checkpoint naming no placeholder, puts
every image at position 0: the prompt then shares no block with any other prompt but the same
images and text, never one it should not.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from accel.block_hash import ImageSlot
from accel.contract import EncodedImage

_PLACEHOLDER_KEYS = ("image_token_id", "image_token_index")


@lru_cache(maxsize=16)
def image_placeholder_id(model_dir: Path) -> int | None:
    """The checkpoint's image placeholder token id; None when its config names none."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for key in _PLACEHOLDER_KEYS:
        if isinstance(config.get(key), int):
            return int(config[key])
    return None


def image_slots(
    token_ids: Sequence[int], images: Sequence[EncodedImage], placeholder_id: int | None
) -> tuple[ImageSlot, ...]:
    """Each image's slot, in order (``images`` in their placeholders' order)."""
    positions = [i for i, t in enumerate(token_ids) if t == placeholder_id] if placeholder_id is not None else []
    if len(positions) != len(images):
        positions = [0] * len(images)
    return tuple(ImageSlot(p, image.content_hash) for p, image in zip(positions, images, strict=True))
