"""Images in chat messages, read as vLLM 0.32's chat parser reads them.

An ``image_url`` part (``{"type": "image_url", "image_url": {"url": ...}}``, or the url as a
string; the Responses API's ``input_image`` alike) becomes ``{"type": "image"}`` in the messages
the chat template renders (what vLLM hands an "openai"-format template), and its URL is fetched
with vLLM's own ``MediaConnector``: data: URLs, ``file://`` paths only under the pool's
``allowed_local_media_path``, http(s) URLs with vLLM's fetch timeout (``VLLM_IMAGE_FETCH_TIMEOUT``)
and ``allowed_media_domains``. The bytes are kept as sent (``EncodedImage``); the engine runs the
model's processor on them. Refused with a 400 naming ``messages``: other modalities (audio, video,
embeddings), an image that cannot be fetched or decoded, images to a model no vLLM pool serves
(TT pools take none yet).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accel.contract import EncodedImage, InvalidRequestError
from accel.vllm.config import VllmEngineConfig
from deployments.config.app import ModelConfig
from serve_app.http.protocol.errors import bad_request

# vLLM 0.32's image part types with a URL (vllm/entrypoints/chat_utils.py; ``input_image`` is the
# Responses API's, its ``image_url`` a string).
IMAGE_PARTS = frozenset({"image_url", "input_image"})
# Its other media part types: no pool honours them.
OTHER_MODALITY_PARTS = frozenset({"input_audio", "audio_url", "video_url", "image_embeds", "audio_embeds", "image_pil"})


@dataclass(frozen=True)
class MediaSettings:
    """vLLM's media engine args of the model's vLLM pool (``extra_args``); None: no vLLM pool."""

    allowed_local_media_path: str = ""
    allowed_media_domains: tuple[str, ...] | None = None


def media_settings(model: ModelConfig) -> MediaSettings | None:
    for pool in model.pools:
        if isinstance(pool.engine_config, VllmEngineConfig):
            extra = pool.engine_config.extra_args or {}
            domains = extra.get("allowed_media_domains")
            return MediaSettings(str(extra.get("allowed_local_media_path") or ""), tuple(domains) if domains else None)
    return None


def image_pool(model: ModelConfig, pinned: str | None) -> str:
    """The pool a request with images goes to: the pinned one if it is a vLLM pool, else the
    model's first vLLM pool (TT pools take no images yet, so the router must not place one
    there; a model with several vLLM pools sends all its image requests to the first)."""
    names = [p.name for p in model.pools if isinstance(p.engine_config, VllmEngineConfig) and p.role == "both"]
    if pinned is not None and pinned not in names:
        raise bad_request(f"pool {pinned!r} takes no images (only vLLM pools do)", "messages")
    if not names:
        raise bad_request("this model is served by no vLLM pool; TT pools take no images yet", "messages")
    return pinned or names[0]


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


def fetch_images(urls: Sequence[str], settings: MediaSettings | None) -> tuple[EncodedImage, ...]:
    """Each URL's image bytes, fetched and decoded by vLLM's ``MediaConnector`` (so a bad image is
    refused here, before routing); the decoded pixels are dropped, the engine decodes again."""
    if not urls:
        return ()
    if settings is None:
        raise bad_request("this model is served by no vLLM pool; TT pools take no images yet", "messages")
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
