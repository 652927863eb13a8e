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
device tier), loads such a prefix back instead of recomputing it, so the router credits it,
below a device-resident one (``router.weights.host_tier_credit``). A block is held while any
medium holds it: ``BlockStored`` carries the fastest tier holding it (``Tier``: GPU -> device,
CPU -> host, any other medium -> storage; copies are told apart by medium and ``ownership``)
and is emitted again when that tier changes (the device evicts a block the host still holds: it
is demoted; the host's copy is loaded back: it is promoted); ``BlockRemoved`` when the last
medium drops it.

Blocks we cannot key faithfully are left out and counted in ``num_skipped_blocks``: a parent we
never saw (we subscribed late: the engine's snapshot repairs that), a different block size, a key
our hash cannot stand for (a prompt embedding's digest), a LoRA id without its name, another
KV-cache group, or an offload event for a block never seen on the device that carries no tokens
to hash. An event is keyed block by block, so its leading blocks are kept up to the first such.
A ``cache_salt`` (published untagged on a chain's first block) starts the chain at
``salted_root(salt)``, as the ingress hashes it; a LoRA adapter's blocks (``lora_name``, published
as every block's first extra key) start it at ``salted_root(salt, lora_name)``, as the ingress
hashes the adapter's requests.

Images: vLLM keys every block an image's (expanded) tokens touch by ``(image id, offset of the
image's start in the block)``, and our vLLM engine passes each image's content hash as its
``multi_modal_uuids`` entry, so the id is ``EncodedImage.content_hash`` (unless the pool sets
``mm_processor_kwargs`` or ``media_io_kwargs``: vLLM then hashes the id with them, and the anchor
below matches no ingress hash, which only costs routing credit). The text blocks before a chain's first image are keyed
as ever; the block where it starts becomes ``accel.block_hash.hash_image_anchor`` (its tokens
before the image, the image's id), the hash the ingress gives that block; the blocks past it are
skipped: their expanded tokens have no counterpart in the ingress's ids (see ``accel.block_hash``).
So two prompts with different images share only their text prefix in the index, and the same
image shares one block more.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from accel.block_hash import BlockHash, hash_block, hash_image_anchor, salted_root
from accel.contract import ConfigError
from deployments.messages.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, Tier

_GPU_MEDIA = (None, "GPU", "gpu")
_GPU = "GPU"


# Who holds a copy of a block: (medium, ownership). vLLM tells tiers of one medium apart by
# ``ownership`` (two STORAGE tiers: a file system and an object store); a copy leaves when its own
# holder drops it.
_Holder = tuple[str, str | None]


def _holder(event: Any) -> _Holder:
    medium = getattr(event, "medium", None)
    return (_GPU if medium in _GPU_MEDIA else str(medium)), getattr(event, "ownership", None)


def _best_tier(holders: set[_Holder]) -> Tier:
    """The fastest tier among the holders of a block (non-empty)."""
    media = {medium for medium, _ in holders}
    if _GPU in media:
        return "device"
    return "host" if any(m.upper() == "CPU" for m in media) else "storage"


def _runs(changes: list[tuple[BlockHash, Tier]]) -> list[BlockStored]:
    """One ``BlockStored`` per run of consecutive blocks with the same tier, in chain order."""
    out: list[BlockStored] = []
    start = 0
    for i in range(1, len(changes) + 1):
        if i == len(changes) or changes[i][1] != changes[start][1]:
            out.append(BlockStored(tuple(h for h, _ in changes[start:i]), tier=changes[start][1]))
            start = i
    return out


class VLLMEventTranslator:
    """One per vLLM replica (its hash table is that engine's)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._ours: dict[Any, BlockHash] = {}  # vLLM block hash -> accel.block_hash hash
        self._held: dict[Any, set[_Holder]] = {}  # vLLM block hash -> its holders (non-empty)
        self._anchors: set[Any] = set()  # the vLLM hashes in _ours that are image anchors
        self.num_skipped_blocks = 0

    def translate(self, events: Iterable[Any]) -> list[KVEvent]:
        out: list[KVEvent] = []
        for event in events:
            kind = type(event).__name__
            if kind == "BlockStored":
                out.extend(_runs(self._stored(event)))
            elif kind == "BlockRemoved" and _is_group0(event):
                removed, demoted = self._removed(event)
                if removed:
                    out.append(BlockRemoved(removed))
                out.extend(_runs(demoted))
            elif kind == "BlockRemoved":
                pass  # another KV-cache group: never keyed
            elif kind == "AllBlocksCleared":
                self._ours.clear()
                self._held.clear()
                self._anchors.clear()
                out.append(AllBlocksCleared())
            else:
                raise TypeError(f"not a vLLM KV event: {event!r}")
        return out

    def _stored(self, event: Any) -> list[tuple[BlockHash, Tier]]:
        """Our hashes of the blocks this event makes held or moves to a faster tier, with that tier."""
        num_blocks = len(event.block_hashes)
        holder = _holder(event)
        lora_name = getattr(event, "lora_name", None)
        block_keys = _block_keys(event, lora_name)
        unnamed_lora = getattr(event, "lora_id", None) is not None and lora_name is None
        if not _is_group0(event) or unnamed_lora or not block_keys:
            self.num_skipped_blocks += num_blocks
            return []
        if holder[0] == _GPU and event.block_size != self.block_size:
            raise ConfigError(
                f"router.block_size: {self.block_size} but the vLLM engine publishes "
                f"blocks of {event.block_size} tokens; they must be equal"
            )
        keyed = self._key(event, block_keys)
        self.num_skipped_blocks += num_blocks - len(keyed)
        return self._hold(keyed, holder)

    def _key(self, event: Any, block_keys: list[_BlockKeys]) -> list[Any]:
        """The event's leading vLLM hashes we can key, the new ones entered in ``_ours``: blocks
        keyed before (copies on another medium), text blocks chained on a keyed parent, and the
        block where the chain's first image starts (its anchor); nothing past an anchor."""
        parent = self._first_parent(event, block_keys[0])
        bs, tokens = self.block_size, event.token_ids
        keyed: list[Any] = []
        for i, (vllm_hash, keys) in enumerate(zip(event.block_hashes, block_keys, strict=True)):
            if vllm_hash in self._ours:
                parent = self._ours[vllm_hash]
            elif parent is None or not keys.is_keyable or event.block_size != bs:
                break  # (an offload placeholder carries no tokens: block size 0)
            elif keys.images:
                image_id, offset = keys.images[0]  # (the image's content hash: the engine names it so)
                if offset < 0:  # the image started in a block we do not hold
                    break
                parent = hash_image_anchor(parent, tokens[i * bs : i * bs + offset], image_id)
                self._ours[vllm_hash] = parent
                self._anchors.add(vllm_hash)
            else:
                parent = hash_block(parent, tokens[i * bs : (i + 1) * bs])
                self._ours[vllm_hash] = parent
            keyed.append(vllm_hash)
            if vllm_hash in self._anchors:
                break
        return keyed

    def _first_parent(self, event: Any, first: _BlockKeys) -> BlockHash | None:
        """Our hash of the event's first block's parent; None when we cannot key it."""
        vllm_parent = event.parent_block_hash
        if vllm_parent is None:
            return salted_root(first.salt, getattr(event, "lora_name", None))
        if vllm_parent in self._anchors:
            return None
        return self._ours.get(vllm_parent)

    def _hold(self, vllm_hashes: Iterable[Any], holder: _Holder) -> list[tuple[BlockHash, Tier]]:
        changed: list[tuple[BlockHash, Tier]] = []
        for h in vllm_hashes:
            media = self._held.setdefault(h, set())
            before = _best_tier(media) if media else None
            media.add(holder)
            if (tier := _best_tier(media)) != before:
                changed.append((self._ours[h], tier))
        return changed

    def _removed(self, event: Any) -> tuple[tuple[BlockHash, ...], list[tuple[BlockHash, Tier]]]:
        """Our hashes of the blocks no medium holds any more after this event, and of those left
        only on a slower tier (with it)."""
        holder, gone, demoted = _holder(event), [], []
        for h in event.block_hashes:
            media = self._held.get(h)
            if media is None:
                continue
            before = _best_tier(media)
            media.discard(holder)
            if not media:
                del self._held[h]
                gone.append(self._ours.pop(h))
                self._anchors.discard(h)
            elif (tier := _best_tier(media)) != before:
                demoted.append((self._ours[h], tier))
        return tuple(gone), demoted


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


@dataclass(frozen=True)
class _BlockKeys:
    """One block's extra keys past the adapter's name, as vLLM publishes them untagged."""

    images: tuple[tuple[str, int], ...] = ()  # (image id, its start's offset in the block; < 0: earlier)
    salt: str | None = None  # the request's cache_salt (a chain's first block only)
    is_keyable: bool = True  # False: a key our hash cannot stand for (a prompt embedding's digest)


def _block_keys(event: Any, lora_name: str | None) -> list[_BlockKeys] | None:
    """Each block's keys; None when the event cannot be keyed at all (an adapter's block without
    its name). A string is the cache_salt, valid on a chain's first block; an ``(id, offset)``
    pair an image."""
    rest = _without_lora(getattr(event, "extra_keys", None), lora_name)
    num_blocks = len(event.block_hashes)
    if rest is False:
        return None
    if not rest:
        return [_BlockKeys()] * num_blocks
    out = []
    for i, keys in enumerate((list(rest) + [None] * num_blocks)[:num_blocks]):
        images, salt, is_keyable = [], None, True
        for key in keys or ():
            if isinstance(key, str) and i == 0 and event.parent_block_hash is None and salt is None:
                salt = key
            elif _is_image_key(key):
                images.append((key[0], key[1]))
            else:
                is_keyable = False
        out.append(_BlockKeys(tuple(images), salt, is_keyable))
    return out


def _is_image_key(key: Any) -> bool:
    return isinstance(key, (tuple, list)) and len(key) == 2 and isinstance(key[0], str) and isinstance(key[1], int)


def _is_group0(event: Any) -> bool:
    return getattr(event, "group_idx", None) in (None, 0)
