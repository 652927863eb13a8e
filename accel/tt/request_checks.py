"""What the TT mesh engine refuses at ``generate`` (before the request reaches the step thread):
an ``InvalidRequestError`` naming the field, so the request fails alone and the engine goes on.

Prompts that leave no room for a token or hold ids outside the vocabulary; fields the engine
cannot honour (``prompt_logprobs``, a grammar's ``whitespace_pattern`` under xgrammar, KV
export/import without KV transfer hooks); out-of-vocabulary ``allowed_token_ids``; images for
a class that takes none, or more than the class takes per request (``check_images``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from accel.contract import GenerateRequest, InvalidRequestError
from accel.tt.multimodal import VisionTraits


def check_request(request: GenerateRequest, *, vocab_size: int, max_model_len: int, can_transfer_kv: bool) -> None:
    n = request.num_prompt_tokens
    if n >= max_model_len:
        raise InvalidRequestError(
            "prompt",
            f"the prompt has {n} tokens but max_model_len is {max_model_len}; at least one token must be generated",
        )
    bad = next((t for t in request.prompt_token_ids if t >= vocab_size), None)
    if bad is not None:
        raise InvalidRequestError("prompt", f"token id {bad} is outside the vocabulary (size {vocab_size})")
    sp = request.sampling
    if sp.prompt_logprobs is not None:
        raise InvalidRequestError("prompt_logprobs", "prompt logprobs are not supported on the TT mesh engine")
    if request.lora is not None:
        raise InvalidRequestError(
            "model", f"{request.lora.name!r} is a LoRA adapter: LoRA is not supported on the TT mesh engine"
        )
    spec = sp.structured_outputs
    if spec is not None and spec.whitespace_pattern is not None:
        raise InvalidRequestError(spec.param, "whitespace_pattern is not supported by the xgrammar backend")
    bad_ids = [t for t in sp.allowed_token_ids or () if t >= vocab_size]
    if bad_ids:
        raise InvalidRequestError("allowed_token_ids", f"out-of-vocab token ids {bad_ids}")
    kv = request.kv_transfer
    if kv is not None and (kv.do_remote_decode or kv.do_remote_prefill) and not can_transfer_kv:
        raise InvalidRequestError("kv_transfer_params", "KV export/import is not supported by the TT mesh engine yet")


# The request field images come in (``GenerateRequest.images``, from chat image parts), named in
# the 400.
IMAGE_FIELD = "images"


def check_images(request: GenerateRequest, images: Sequence[Any], vision: VisionTraits, model_name: str) -> None:
    if not images:
        return
    kv = request.kv_transfer
    if kv is not None and (kv.do_remote_decode or kv.do_remote_prefill):
        # The decode side would need the images' rope deltas (and the prompt's image features are
        # only in the exported KV): keep image requests colocated.
        raise InvalidRequestError("kv_transfer_params", "KV export/import of a request with images is not supported")
    if not vision.is_multimodal:
        raise InvalidRequestError(IMAGE_FIELD, f"{model_name} is not a multimodal model: it takes no images")
    limit = vision.max_images_per_request
    if limit is not None and len(images) > limit:
        raise InvalidRequestError(
            IMAGE_FIELD, f"at most {limit} image(s) may be provided in one request to {model_name}, got {len(images)}"
        )
