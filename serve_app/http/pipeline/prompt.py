"""Stage 2, prompt: chat template, tokenization and the prompts' chained block hashes, off the
event loop in one hop (a long prompt must not stall other requests)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from accel.block_hash import BlockHash, hash_prompt_blocks, salted_root
from accel.contract import EncodedImage
from serve_app.http.pipeline.image_slots import image_placeholder_id, image_slots
from serve_app.http.pipeline.parse import Parsed
from serve_app.http.protocol import conversion as conv
from serve_app.http.protocol.chat import ChatCompletionRequest
from serve_app.http.protocol.chat_images import fetch_images, image_pool, media_settings, split_images
from serve_app.http.workers import in_worker

TokenIds = tuple[int, ...]


@dataclass(frozen=True)
class Prompts:
    token_ids: tuple[TokenIds, ...]  # one per prompt of the request
    # Each distinct prompt's chained block hashes; () for all when no router places the request.
    hashes: Mapping[TokenIds, tuple[BlockHash, ...]]
    # A chat's images, in the order of their placeholders in its one prompt (accel.contract.media).
    # Its block hashes key every block from the first image's on by the images' content hashes
    # (image_slots; accel.block_hash): different images share no block, the same image does.
    images: tuple[EncodedImage, ...] = ()
    # The pool those images pin the request to (chat_images.image_pool, asked once here: the
    # images were fetched with its media settings); None without images.
    images_pool: str | None = None


async def prompt(parsed: Parsed, block_size: int | None) -> Prompts:
    """``block_size``: the model's routing block size, None when the request goes straight to its
    pool's only replica (no router to tell)."""
    return await in_worker(_prompts_and_hashes, parsed, block_size)


def _prompts_and_hashes(parsed: Parsed, block_size: int | None) -> Prompts:
    req, target = parsed.request, parsed.target
    images: tuple[EncodedImage, ...] = ()
    images_pool = None
    if isinstance(req, ChatCompletionRequest):
        messages, urls = split_images(req.messages)
        if urls:
            pool = image_pool(target.model, parsed.pool)
            images, images_pool = fetch_images(urls, media_settings(pool)), pool.name
            req = req.model_copy(update={"messages": messages})
    ids = tuple(conv.request_prompts(req, target.tok, target.model.max_model_len, parsed.plan))
    if block_size is None:
        return Prompts(ids, dict.fromkeys(ids, ()), images, images_pool)
    # Every choice carries the request's cache_salt (and adapter): one chain root, so salted
    # prompts (and an adapter's) share no hash with others.
    root = salted_root(req.cache_salt, target.lora)
    placeholder = image_placeholder_id(target.model.path) if images else None
    hashes = {p: tuple(hash_prompt_blocks(p, block_size, root, image_slots(p, images, placeholder))) for p in set(ids)}
    return Prompts(ids, hashes, images, images_pool)
