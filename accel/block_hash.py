"""Chained hashes of full token blocks, identical in every process.

``h(i) = H(h(i-1) || tokens of block i)``, so equal hashes mean equal prefixes up to and
including the block. Engines key their prefix caches on these; the router keys its prefix index
on the same values, which is why the hash must never depend on the process (Python's ``hash()``
is salted per process): blake2b over a fixed little-endian encoding, 128-bit result.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

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


def hash_prompt_blocks(token_ids: Sequence[int], block_size: int, parent: BlockHash = ROOT_HASH) -> list[BlockHash]:
    """Chained hashes of every *full* block of ``token_ids`` (a trailing partial block has none)."""
    hashes: list[BlockHash] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes
