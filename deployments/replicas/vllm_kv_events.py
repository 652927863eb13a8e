"""Translate vLLM KV events (``vllm.distributed.kv_events``) into the router's hash space.

vLLM keys its prefix cache with its own block hashes (seeded per deployment, sha256/cbor), not
``accel.block_hash``; but its ``BlockStored`` carries the blocks' token ids and the parent hash.
So, per replica, we recompute our chained hash for every stored block and remember
vLLM hash -> our hash; ``BlockRemoved`` is mapped back through that table (which therefore stays
as large as the engine's cache). Events are duck-typed (attribute names as vLLM spells them), so
this module does not import vLLM.

Blocks we cannot key faithfully are left out and counted in ``num_skipped_blocks``: a parent we
never saw (we subscribed late: the engine's snapshot repairs that), a different block size, LoRA
or multimodal extra keys (our hash covers tokens only), another KV-cache group or a non-GPU
medium (an offload tier is not a prefix hit for the scheduler). A ``cache_salt`` (the first
block's only extra key) starts the chain at ``salted_root(salt)``, as the ingress hashes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from accel.block_hash import BlockHash, hash_block, salted_root
from accel.contract import ConfigError
from deployments.router.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

_GPU_MEDIA = (None, "GPU", "gpu")


class VLLMEventTranslator:
    """One per vLLM replica (its hash table is that engine's)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._ours: dict[Any, BlockHash] = {}  # vLLM block hash -> accel.block_hash hash
        self.num_skipped_blocks = 0

    def translate(self, events: Iterable[Any]) -> list[KVEvent]:
        out: list[KVEvent] = []
        for event in events:
            kind = type(event).__name__
            if kind == "BlockStored":
                stored = self._stored(event)
                if stored:
                    out.append(BlockStored(stored))
            elif kind == "BlockRemoved":
                if _is_primary(event):
                    removed = tuple(h for h in (self._ours.pop(v, None) for v in event.block_hashes) if h is not None)
                    if removed:
                        out.append(BlockRemoved(removed))
            elif kind == "AllBlocksCleared":
                self._ours.clear()
                out.append(AllBlocksCleared())
            else:
                raise TypeError(f"not a vLLM KV event: {event!r}")
        return out

    def _stored(self, event: Any) -> tuple[BlockHash, ...]:
        num_blocks = len(event.block_hashes)
        if event.block_size != self.block_size:
            raise ConfigError(
                f"router.block_size: {self.block_size} but the vLLM engine publishes "
                f"blocks of {event.block_size} tokens; they must be equal"
            )
        extra_keys = getattr(event, "extra_keys", None)
        salt = _cache_salt(event, extra_keys)
        lora = getattr(event, "lora_id", None) is not None or getattr(event, "lora_name", None) is not None
        if not _is_primary(event) or lora or (extra_keys and any(extra_keys) and salt is None):
            self.num_skipped_blocks += num_blocks
            return ()
        if event.parent_block_hash is None:
            parent = salted_root(salt)
        elif event.parent_block_hash in self._ours:
            parent = self._ours[event.parent_block_hash]
        else:
            self.num_skipped_blocks += num_blocks
            return ()
        bs, tokens, stored = self.block_size, event.token_ids, []
        for i, vllm_hash in enumerate(event.block_hashes):
            parent = hash_block(parent, tokens[i * bs : (i + 1) * bs])
            self._ours[vllm_hash] = parent
            stored.append(parent)
        return tuple(stored)


def _cache_salt(event: Any, extra_keys: Any) -> str | None:
    """The request's cache_salt when it is a chain's first block's only extra key (vLLM
    publishes it untagged, as ``(salt,)``, on the first block alone): that chain then starts at
    ``salted_root(salt)``, as the ingress hashes the request. None otherwise."""
    if not extra_keys or event.parent_block_hash is not None or any(extra_keys[1:]):
        return None
    first = extra_keys[0]
    if isinstance(first, (tuple, list)) and len(first) == 1 and isinstance(first[0], str):
        return first[0]
    return None


def _is_primary(event: Any) -> bool:
    return getattr(event, "medium", None) in _GPU_MEDIA and getattr(event, "group_idx", None) in (None, 0)
