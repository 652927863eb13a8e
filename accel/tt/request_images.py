"""A request's encoded images (``GenerateRequest.images``) made model inputs on the host.

The ingress sends the image files' bytes with one placeholder token per image in the prompt;
here, before the request reaches the step loop, each is decoded, run through the checkpoint's HF
image processor (``ImageProcessing``) and its placeholder expanded, off the event loop (the
processor is CPU work). The request that goes on carries the expanded prompt and no encoded
images; the processed ``ImageInput``s travel beside it (``AddRequest.images``).
"""

from __future__ import annotations

import asyncio
import dataclasses

from accel.contract import GenerateRequest
from accel.tt.image_processing import ImageProcessing, decode_image
from accel.tt.model_setup import load_hf_config
from accel.tt.multimodal import ImageInput, VisionTraits
from accel.tt.request_checks import check_images


class RequestImages:
    """The engine's host-side image step for ``model_dir`` (its processor loaded on first use)."""

    def __init__(self, model_dir: str, vision: VisionTraits) -> None:
        self._model_dir = model_dir
        self._vision = vision
        self._processing: ImageProcessing | None = None

    async def prepare(self, request: GenerateRequest) -> tuple[GenerateRequest, tuple[ImageInput, ...]]:
        """``request`` with its placeholders expanded and no encoded images, and its images as the
        model takes them. Refusals (400 naming ``images``): images on a text-only class, more than
        the class takes, bytes that are not an image, a placeholder count that does not match."""
        check_images(request, request.images, self._vision, self._model_dir)
        ids, inputs = await asyncio.to_thread(self._process, request)
        return dataclasses.replace(request, prompt_token_ids=ids, images=()), inputs

    def _process(self, request: GenerateRequest) -> tuple[tuple[int, ...], tuple[ImageInput, ...]]:
        if self._processing is None:
            self._processing = ImageProcessing(self._model_dir, load_hf_config(self._model_dir))
        pictures = [decode_image(image.data) for image in request.images]
        return self._processing.process(request.prompt_token_ids, pictures)
