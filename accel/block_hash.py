"""Chained hashes of full token blocks, identical in every process.

``h(i) = H(h(i-1) || tokens of block i)``, so equal hashes mean equal prefixes up to and
including the block. Engines key their prefix caches on these; the router keys its prefix index
on the same values, which is why the hash must never depend on the process (Python's ``hash()``
is salted per process): blake2b over a fixed little-endian encoding, 128-bit result.

Images (``ImageSlot``): an engine's processor expands each image placeholder into many tokens
(vLLM's multimodal processor, by the image's size), so the ingress, which has the prompt's ids
before that expansion, cannot hash the engine's image-bearing blocks. What both sides can hash is
the prefix up to the first image's start: its full text blocks as ever, then one *image anchor*,
``hash_image_anchor(parent, tokens of its block before the image, image content hash)``, which
the KV-event translator computes from the engine's block that holds the image's start (vLLM keys
that block by ``(image id, offset)`` and the engine names each image by its content hash). The
ingress chains the blocks past the anchor over its own unexpanded ids with every image's content
hash mixed in (``hash_image_block``): routing-history entries only (no engine event yields them),
so two prompts with different images share nothing from the first image on and the same image
and text share everything.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

BlockHash = int

ROOT_HASH: BlockHash = 0  # the "parent" of a prompt's first block


def salted_root(cache_salt: str | None, lora_name: str | None = None) -> BlockHash:
    """The parent of a prompt's first block: ``ROOT_HASH``, or for a request with a
    ``cache_salt`` a hash of the salt, so its chain shares no hash with unsalted prompts or with
    another salt's (vLLM mixes the salt into its first block's hash the same way). A request run
    with a LoRA adapter (``lora_name``, the adapter's served name) roots its chain at a hash of the
    adapter too: the same prompt under two adapters, or under one and the base model, never shares
    a block (vLLM keys every block of an adapter request by its adapter)."""
    if not lora_name:
        if not cache_salt:
            return ROOT_HASH
        h = hashlib.blake2b(digest_size=16, person=b"cache_salt")
        h.update(cache_salt.encode("utf-8"))
        return int.from_bytes(h.digest(), "little")
    h = hashlib.blake2b(digest_size=16, person=b"lora_root")
    salt = (cache_salt or "").encode("utf-8")
    h.update(len(salt).to_bytes(8, "little") + salt)  # length-prefixed: (salt, name) pairs stay distinct
    h.update(lora_name.encode("utf-8"))
    return int.from_bytes(h.digest(), "little")


def hash_block(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    h = hashlib.blake2b(digest_size=16)
    h.update(parent.to_bytes(16, "little"))
    h.update(struct.pack(f"<{len(token_ids)}I", *token_ids))
    return int.from_bytes(h.digest(), "little")


@dataclass(frozen=True)
class ImageSlot:
    """An image in a prompt: ``position`` the index of its placeholder token in the prompt's ids
    before the engine expands it (where the engine's expansion starts), ``content_hash`` its
    identity (``accel.contract.EncodedImage.content_hash``)."""

    position: int
    content_hash: str


def hash_image_anchor(parent: BlockHash, token_ids_before: Sequence[int], content_hash: str) -> BlockHash:
    """The block holding an image's start, keyed by what precedes the image in it
    (``token_ids_before``, possibly none) and the image's content hash; the tokens from the
    image on, whose count only the engine's processor knows, do not enter it."""
    h = hashlib.blake2b(digest_size=16, person=b"image_anchor")
    h.update(parent.to_bytes(16, "little") + len(token_ids_before).to_bytes(8, "little"))
    h.update(struct.pack(f"<{len(token_ids_before)}I", *token_ids_before))
    h.update(content_hash.encode("utf-8"))
    return int.from_bytes(h.digest(), "little")


def hash_image_block(parent: BlockHash, token_ids: Sequence[int], content_hashes: Sequence[str]) -> BlockHash:
    """A block past an image anchor: its unexpanded ids and the content hashes of the images
    whose placeholders it holds."""
    h = hashlib.blake2b(digest_size=16, person=b"image_block")
    h.update(parent.to_bytes(16, "little") + len(token_ids).to_bytes(8, "little"))
    h.update(struct.pack(f"<{len(token_ids)}I", *token_ids))
    for content_hash in content_hashes:
        key = content_hash.encode("utf-8")
        h.update(len(key).to_bytes(8, "little") + key)
    return int.from_bytes(h.digest(), "little")


def hash_prompt_blocks(
    token_ids: Sequence[int], block_size: int, parent: BlockHash = ROOT_HASH, images: Sequence[ImageSlot] = ()
) -> list[BlockHash]:
    """Chained hashes of every *full* block of ``token_ids`` (a trailing partial block has none).
    With ``images`` (in placeholder order): the full blocks before the first image's block, its
    anchor (even when these ids end inside that block: the expanded image fills it), then the
    blocks past it (see the module docstring), one hash per block as for text."""
    end = len(token_ids) if not images else images[0].position // block_size * block_size
    hashes: list[BlockHash] = []
    for start in range(0, end - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    if images:
        first = images[0].position
        hashes.append(hash_image_anchor(parent, token_ids[end:first], images[0].content_hash))
        start = first  # the first block past the anchor also covers the anchor block's rest
        for stop in range(end + 2 * block_size, len(token_ids) + 1, block_size):
            in_block = [image.content_hash for image in images if start <= image.position < stop]
            hashes.append(hash_image_block(hashes[-1], token_ids[start:stop], in_block))
            start = stop
    return hashes
