"""Translate vLLM KV events (``vllm.distributed.kv_events``) into the router's hash space.

vLLM keys its prefix cache with its own block hashes (seeded per deployment, sha256/cbor), not
``accel.block_hash``; but its ``BlockStored`` carries the blocks' token ids and the parent hash.
So, per replica, we recompute our chained hash for every stored block and remember
vLLM hash -> our hash; ``BlockRemoved`` is mapped back through that table (which therefore stays
as large as the engine's cache). Events are duck-typed (attribute names as vLLM spells them), so
this module does not import vLLM.

Offloaded blocks count: an engine with a host-DRAM (or storage) KV tier, whose connector
publishes its events (vLLM's ``OffloadingConnector`` and subclasses such as torchtpu's
``TPURaidenOffloadingConnector``: ``medium`` "CPU" / "STORAGE", the same block hashes as the
device tier), loads such a prefix back instead of recomputing it, so the router credits it like
a device-resident one. A block is held while any medium holds it: ``BlockStored`` is emitted when
the first medium stores it, ``BlockRemoved`` when the last one drops it.

Blocks we cannot key faithfully are left out and counted in ``num_skipped_blocks``: a parent we
never saw (we subscribed late: the engine's snapshot repairs that), a different block size,
multimodal extra keys (our hash covers tokens only), a LoRA id without its name, another KV-cache
group, or an offload event for a block never seen on the device that carries no tokens to hash.
A ``cache_salt`` (the first block's only extra key) starts the chain at ``salted_root(salt)``,
as the ingress hashes it; a LoRA adapter's blocks (``lora_name``, published as every block's
first extra key) start it at ``salted_root(salt, lora_name)``, as the ingress hashes the
adapter's requests.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from accel.block_hash import BlockHash, hash_block, salted_root
from accel.contract import ConfigError
from deployments.messages.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

_GPU_MEDIA = (None, "GPU", "gpu")
_GPU = "GPU"


def _medium(event: Any) -> str:
    medium = getattr(event, "medium", None)
    return _GPU if medium in _GPU_MEDIA else str(medium)


class VLLMEventTranslator:
    """One per vLLM replica (its hash table is that engine's)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._ours: dict[Any, BlockHash] = {}  # vLLM block hash -> accel.block_hash hash
        self._held: dict[Any, set[str]] = {}  # vLLM block hash -> media holding it (non-empty)
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
                removed = self._removed(event) if _is_group0(event) else ()
                if removed:
                    out.append(BlockRemoved(removed))
            elif kind == "AllBlocksCleared":
                self._ours.clear()
                self._held.clear()
                out.append(AllBlocksCleared())
            else:
                raise TypeError(f"not a vLLM KV event: {event!r}")
        return out

    def _stored(self, event: Any) -> tuple[BlockHash, ...]:
        """Our hashes of the blocks this event makes held (not those already held elsewhere)."""
        num_blocks = len(event.block_hashes)
        medium = _medium(event)
        lora_name = getattr(event, "lora_name", None)
        extra_keys = _without_lora(getattr(event, "extra_keys", None), lora_name)
        salt = _cache_salt(event, extra_keys) if extra_keys is not False else None
        unnamed_lora = getattr(event, "lora_id", None) is not None and lora_name is None
        if (
            not _is_group0(event)
            or unnamed_lora
            or extra_keys is False
            or (extra_keys and any(extra_keys) and salt is None)
        ):
            self.num_skipped_blocks += num_blocks
            return ()
        if medium == _GPU and event.block_size != self.block_size:
            raise ConfigError(
                f"router.block_size: {self.block_size} but the vLLM engine publishes "
                f"blocks of {event.block_size} tokens; they must be equal"
            )
        if all(h in self._ours for h in event.block_hashes):
            return self._hold(event.block_hashes, medium)  # copies (another medium) of blocks we keyed
        if event.block_size != self.block_size:  # (an offload placeholder: no tokens, block size 0)
            self.num_skipped_blocks += num_blocks
            return ()
        if event.parent_block_hash is None:
            parent = salted_root(salt, lora_name)
        elif event.parent_block_hash in self._ours:
            parent = self._ours[event.parent_block_hash]
        else:
            self.num_skipped_blocks += num_blocks
            return ()
        bs, tokens = self.block_size, event.token_ids
        for i, vllm_hash in enumerate(event.block_hashes):
            parent = hash_block(parent, tokens[i * bs : (i + 1) * bs])
            self._ours[vllm_hash] = parent
        return self._hold(event.block_hashes, medium)

    def _hold(self, vllm_hashes: Iterable[Any], medium: str) -> tuple[BlockHash, ...]:
        newly = []
        for h in vllm_hashes:
            media = self._held.setdefault(h, set())
            if not media:
                newly.append(self._ours[h])
            media.add(medium)
        return tuple(newly)

    def _removed(self, event: Any) -> tuple[BlockHash, ...]:
        """Our hashes of the blocks no medium holds any more after this event."""
        medium, gone = _medium(event), []
        for h in event.block_hashes:
            media = self._held.get(h)
            if media is None:
                continue
            media.discard(medium)
            if not media:
                del self._held[h]
                gone.append(self._ours.pop(h))
        return tuple(gone)


def _without_lora(extra_keys: Any, lora_name: str | None) -> Any:
    """The blocks' extra keys past the adapter's name (vLLM publishes it first on every block of
    an adapter request); False when a block lacks it (the event cannot be keyed)."""
    if lora_name is None:
        return extra_keys
    if not extra_keys:
        return False
    rest = []
    for keys in extra_keys:
        if not isinstance(keys, (tuple, list)) or not keys or keys[0] != lora_name:
            return False
        rest.append(tuple(keys[1:]) or None)
    return rest


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


def _is_group0(event: Any) -> bool:
    return getattr(event, "group_idx", None) in (None, 0)
