"""Host-side image processing for the TT mesh engine: the checkpoint's own HF image processor.

vLLM runs a model's HF processor in front of the engine; vllm-tt-plugin hands the model what it
produced (``pixel_values``, ``image_grid_thw`` per image). This does the same for our engine: each
image goes through the checkpoint's image processor (``AutoImageProcessor``: resize, normalize,
patchify), and each image's one placeholder token in the prompt is expanded to one per merged
patch, as ``Qwen2_5_VLProcessor`` expands ``<|image_pad|>`` (it is not built here: transformers
5.19 constructs it only with torchvision, for its video part).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from accel.contract import InvalidRequestError
from accel.tt.multimodal import ImageInput
from accel.tt.request_checks import IMAGE_FIELD


class ImageProcessing:
    """``model_dir``'s image processor and image placeholder token."""

    def __init__(self, model_dir: str, hf_config: Any) -> None:
        from transformers import AutoImageProcessor  # deferred: only multimodal models need it

        self._processor = AutoImageProcessor.from_pretrained(model_dir)  # type: ignore[no-untyped-call]
        self._merge = int(getattr(self._processor, "merge_size", 2)) ** 2
        self.image_token_id = int(hf_config.image_token_id)

    def process(
        self, prompt_token_ids: Sequence[int], images: Sequence[Any]
    ) -> tuple[tuple[int, ...], tuple[ImageInput, ...]]:
        """``prompt_token_ids`` with one image placeholder per image (what a chat template renders)
        and the images (PIL images, in prompt order) -> the prompt with each placeholder expanded
        to the image's tokens, and the images as the model takes them."""
        slots = [i for i, t in enumerate(prompt_token_ids) if t == self.image_token_id]
        if len(slots) != len(images):
            raise InvalidRequestError(
                IMAGE_FIELD, f"the prompt has {len(slots)} image placeholders for {len(images)} images"
            )
        inputs = []
        for img in images:
            out = self._processor(images=[img], return_tensors="pt")
            inputs.append(ImageInput(out["pixel_values"], out["image_grid_thw"]))
        ids: list[int] = []
        start = 0
        for slot, image in zip(slots, inputs):
            ids.extend(prompt_token_ids[start:slot])
            ids.extend([self.image_token_id] * (int(image.image_grid_thw.prod()) // self._merge))
            start = slot + 1
        ids.extend(prompt_token_ids[start:])
        return tuple(ids), tuple(inputs)


def decode_image(data: bytes, field_name: str = "images") -> Any:
    """An encoded image file's bytes (PNG, JPEG, ...) as an RGB PIL image, what the HF image
    processor takes (vLLM converts to RGB too); bytes PIL cannot read are a 400 naming the field."""
    from PIL import Image, UnidentifiedImageError  # deferred: only multimodal models need PIL

    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InvalidRequestError(field_name, f"cannot decode the image: {exc}") from None
