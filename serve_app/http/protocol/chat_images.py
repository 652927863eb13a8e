"""Images in chat messages, read as vLLM 0.32's chat parser reads them.

An ``image_url`` part (``{"type": "image_url", "image_url": {"url": ...}}``, or the url as a
string; the Responses API's ``input_image`` alike) becomes ``{"type": "image"}`` in the messages
the chat template renders (what vLLM hands an "openai"-format template), and its URL is fetched
with vLLM's own ``MediaConnector``: data: URLs, ``file://`` paths only under the pool's
``allowed_local_media_path``, http(s) URLs with vLLM's fetch timeout (``VLLM_IMAGE_FETCH_TIMEOUT``)
and ``allowed_media_domains``. The bytes are kept as sent (``EncodedImage``); the engine runs the
model's processor on them (vLLM's multimodal processor on a vLLM pool, the checkpoint's HF image
processor host-side on a TT pool).

Which pool (``image_pool``): the request is pinned to one pool whose engine takes images: a
generating vLLM pool (vLLM's engine refuses a text-only checkpoint itself), or a TT pool whose
class for the checkpoint on its backend is a vision class (``accel.tt.registry.
checkpoint_vision_traits``, read without building the model). A TT pool's engine config has no
``allowed_local_media_path``: data: and http(s) URLs only. Refused with a 400 naming
``messages``: other modalities (audio, video, embeddings), an image that cannot be fetched or
decoded, images to a model none of whose pools takes them (the message says why, per pool).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accel.contract import EncodedImage, InvalidRequestError
from accel.tt.config import TTEngineConfig
from accel.tt.model_setup import load_hf_config
from accel.tt.multimodal import VisionTraits
from accel.tt.registry import BACKEND_TORCH, BACKEND_TTNN, checkpoint_vision_traits
from accel.vllm.config import VllmEngineConfig
from deployments.config.app import ModelConfig, PoolConfig
from serve_app.http.protocol.errors import bad_request

# vLLM 0.32's image part types with a URL (vllm/renderers/chat_utils.py; ``input_image`` is the
# Responses API's, its ``image_url`` a string).
IMAGE_PARTS = frozenset({"image_url", "input_image"})
# Its other media part types: no pool honours them.
OTHER_MODALITY_PARTS = frozenset({"input_audio", "audio_url", "video_url", "image_embeds", "audio_embeds", "image_pil"})


@dataclass(frozen=True)
class MediaSettings:
    """vLLM's media engine args, as the pool the images go to has them."""

    allowed_local_media_path: str = ""
    allowed_media_domains: tuple[str, ...] | None = None


def media_settings(pool: PoolConfig) -> MediaSettings:
    """A vLLM pool's from its ``extra_args``; a TT pool's config has no media args (its engine
    takes no such keys), so data: and http(s) URLs only."""
    if not isinstance(pool.engine_config, VllmEngineConfig):
        return MediaSettings()
    extra = pool.engine_config.extra_args or {}
    domains = extra.get("allowed_media_domains")
    return MediaSettings(str(extra.get("allowed_local_media_path") or ""), tuple(domains) if domains else None)


def image_pool(model: ModelConfig, pinned: str | None) -> PoolConfig:
    """The pool a request with images goes to (the request is pinned there: the router places it
    among that pool's replicas and never disaggregates it): the pinned one if its engine takes
    images, else the model's first pool whose engine does. 400 naming ``messages`` (and why, per
    pool) when none does."""
    pools = [p for p in model.pools if p.name == pinned] if pinned is not None else list(model.pools)
    for pool in pools:
        if _why_no_images(pool) is None:
            return pool
    why = "; ".join(f"pool {p.name!r}: {_why_no_images(p)}" for p in pools)
    raise bad_request(f"model {model.name!r} takes no images here ({why})", "messages")


def _why_no_images(pool: PoolConfig) -> str | None:
    """None when ``pool``'s engine takes images: a generating vLLM pool unless vLLM's args allow
    none (a text-only checkpoint there is refused by the engine, vLLM's own 400 naming images); a
    TT pool whose class for the checkpoint, on its backend, is multimodal."""
    if pool.role != "both":
        return f"a {pool.role} pool (requests with images are not disaggregated)"
    if "generate" not in pool.tasks:
        return "an embedding pool"
    if isinstance(pool.engine_config, TTEngineConfig):
        backend = BACKEND_TTNN if pool.accelerator == "tt" else BACKEND_TORCH
        if not _tt_vision(str(pool.model_path), backend).is_multimodal:
            return f"its TT class for this checkpoint ({backend}) is text-only"
        return None
    extra = pool.engine_config.extra_args or {}
    limit = (extra.get("limit_mm_per_prompt") or {}).get("image")
    if extra.get("language_model_only") or (limit.get("count") if isinstance(limit, Mapping) else limit) == 0:
        return "its engine args allow no images (limit_mm_per_prompt / language_model_only)"
    return None


@functools.cache
def _tt_vision(model_path: str, backend: str) -> VisionTraits:
    """What the TT class serving ``model_path`` on ``backend`` takes, read once per checkpoint (it
    imports the class, never builds it)."""
    return checkpoint_vision_traits(load_hf_config(model_path), backend)


def split_images(messages: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """``messages`` with each image part as ``{"type": "image"}``, and the image URLs in order."""
    out, urls = [], []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(isinstance(p, Mapping) and p.get("type") == "image" for p in content):
            # (the marker this function leaves; from a client it would be a placeholder without an image)
            raise bad_request("content parts of type 'image' are not supported", "messages")
        if not isinstance(content, list) or not any(_is_media(p) for p in content):
            out.append(dict(message))
            continue
        parts = []
        for part in content:
            if _is_media(part) and part.get("type") not in IMAGE_PARTS:
                raise bad_request(f"content parts of type {part.get('type')!r} are not supported", "messages")
            if _is_media(part):
                urls.append(_url_of(part))
                parts.append({"type": "image"})
            else:
                parts.append(part)
        out.append({**message, "content": parts})
    return out, tuple(urls)


def without_media(messages: Any) -> Any:
    """``messages`` (the raw JSON value) without its media parts, for counting prompt text: an
    image's URL or data is no text of the prompt. Anything not a list of messages as it is."""
    if not isinstance(messages, list):
        return messages
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            message = {**message, "content": [p for p in content if not _is_media(p)]}
        out.append(message)
    return out


def _is_media(part: Any) -> bool:
    return isinstance(part, Mapping) and (part.get("type") in IMAGE_PARTS or part.get("type") in OTHER_MODALITY_PARTS)


def _url_of(part: Mapping[str, Any]) -> str:
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, Mapping) else value
    if not isinstance(url, str) or not url:
        raise bad_request("an image_url part needs a url", "messages")
    return url


def fetch_images(urls: Sequence[str], settings: MediaSettings) -> tuple[EncodedImage, ...]:
    """Each URL's image bytes, fetched and decoded by vLLM's ``MediaConnector`` (so a bad image is
    refused here, before routing); the decoded pixels are dropped, the engine decodes again."""
    if not urls:
        return ()
    # deferred: vLLM is imported only where images arrive (a TT-only install serves text without it)
    from vllm.multimodal.media.connector import MediaConnector

    try:
        connector = MediaConnector(
            allowed_local_media_path=settings.allowed_local_media_path,
            allowed_media_domains=list(settings.allowed_media_domains) if settings.allowed_media_domains else None,
        )
        return tuple(_encoded(connector.fetch_image(url)) for url in urls)
    except InvalidRequestError as exc:
        raise bad_request(exc.message, "messages") from None
    except Exception as exc:  # vLLM raises ValueError / OSError / HTTP errors for a bad or refused URL
        raise bad_request(str(exc), "messages") from None


def _encoded(image: Any) -> EncodedImage:
    """``image``: vLLM's ``MediaWithBytes`` (the decoded image and the bytes it came from)."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(image.original_bytes)) as header:  # (reads the header only)
        mime = Image.MIME.get(header.format or "", "image/unknown")
    return EncodedImage(image.original_bytes, mime)
