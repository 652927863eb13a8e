"""Images on a vLLM pool: what the engine checks and how it hands an ``EncodedImage`` to vLLM.

No preprocessing of ours: the bytes are decoded by vLLM's ``ImageMediaIO`` (what its chat parser
does with an ``image_url``), and vLLM's multimodal processor (the model's HF processor) expands
the placeholders and makes the pixels, as on a bare vLLM server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from accel.contract import EncodedImage, GenerateRequest, InvalidRequestError


def max_images_per_prompt(model_config: Any) -> int:
    mm = model_config.multimodal_config
    if not model_config.is_multimodal_model or mm is None:
        return 0
    return int(mm.get_limit_per_prompt("image"))


def check_images(request: GenerateRequest, max_images: int) -> None:
    """vLLM's own refusals, before the request reaches its processor (same messages)."""
    if request.images and max_images == 0:
        raise InvalidRequestError("images", "this model takes no images (it is not a multimodal model)")
    if len(request.images) > max_images:
        raise InvalidRequestError("images", f"At most {max_images} image(s) may be provided in one prompt.")


def decode_image(image: EncodedImage) -> Any:
    """``image`` as vLLM's chat parser hands it on (``ImageMediaIO.load_bytes``: the PIL image in
    RGB with its original bytes, which vLLM's multimodal hasher reads). An undecodable image is a
    400 naming ``images``."""
    # deferred: vLLM is imported only after the engine chose its platform (accel.vllm.engine)
    from vllm.multimodal.media.image import ImageMediaIO

    try:
        return ImageMediaIO().load_bytes(image.data)
    except Exception as exc:  # PIL raises several types for a bad file
        raise InvalidRequestError("images", f"cannot decode the {image.mime} image: {exc}") from None


def image_prompt_fields(images: Sequence[EncodedImage]) -> dict[str, Any]:
    """The fields of vLLM's prompt dict that carry ``images``: the decoded images, which vLLM's own
    multimodal processor expands (each placeholder) and turns into pixels, and each image's name,
    its content hash: vLLM keys the blocks it touches (and their KV events) by that id, which the
    router's index matches (deployments/replicas/vllm_kv_events.py)."""
    return {
        "multi_modal_data": {"image": [decode_image(image) for image in images]},
        "multi_modal_uuids": {"image": [image.content_hash for image in images]},
    }
