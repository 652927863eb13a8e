"""``KVTransferHooks``: prefill/decode KV transfer for the TT engine, through the KV-connector
actor in the canonical format. Implements ``accel.tt.engine_core.KVHookPoints``.

Export (``on_finished``, engine thread, a ``do_remote_decode`` request that finished normally and
still holds its blocks): gather the prompt's KV from the lane's pages into the canonical payload,
put it to the actor and return the ticket ``{do_remote_prefill, transfer_id, num_tokens}`` for the
final delta. The put is synchronous (one copy into the node's shared-memory store, no RPC, or
for large payloads into the object store plus one RPC; waits at most ``put_timeout_s`` when the
store is full, stalling this engine's step loop that long): the ticket is only handed out once
the payload is committed, so the decode side never races the producer (a decode replica on another
node learns where it is from the actor, which waits briefly for the producer's background note:
``deployments.kv.connector_actor.NOTE_GRACE_S``). A failed put returns no ticket and the
decode side recomputes.

Import: ``prefetch`` (asyncio side, called by ``TTMeshEngine.generate``) reads the payload named by
``do_remote_prefill`` (a zero-copy view of the node's store, or via the actor and the object
store), off the engine thread; then
``on_added`` (engine thread, the request was bound to its lane and nothing is scheduled) refuses
another model (fingerprint, dtype, shapes) or other prompt tokens (block hashes), then writes the
prompt's full blocks into freshly allocated blocks of the lane's allocator, registers them in its prefix
cache under the prompt's chained hashes and releases them to the cache's LRU queue, then writes the
partial last block (up to,
not including, the last prompt token) into a block the request holds and marks it preloaded.
Admission adopts both and marks every prompt token but the last computed, so the request starts
in a DECODE step (its last prompt token is its first decode input): a decode engine never
interrupts its running requests with a prefill step for an imported prompt. If the cache lost a
block in between, or there is no room for the tail block, the rest is prefilled as an ordinary
prefix hit. Blocks the lane already caches are not rewritten. Any failure (missing or expired transfer, dead actor,
mismatch, no free blocks) -> the prompt is prefilled locally and the actor counts a recompute.

Prefix sharing (``share_prefixes=True``, the actor's host-memory prefix tier): every request that
finishes normally offers its prompt's full blocks the tier has not had from this engine; every
new request without a ticket first asks the tier for the longest run of its leading blocks this
lane lacks and imports them the same way as a transfer (prefix cache, then an ordinary hit). Tier
keys are (model fingerprint + KV dtype, block size, chained hash), so only engines with the same
block size share blocks. Lookups are best effort: an unreachable tier means a normal prefill.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import torch

from accel.block_hash import hash_prompt_blocks, salted_root
from accel.contract import GenerateRequest, KVTransferParams
from accel.kv_transfer import params as kv_params
from accel.kv_transfer.fingerprint import model_fingerprint
from accel.kv_transfer.payload import KVDescriptor, KVPayload
from accel.kv_transfer.transport import KVTransport, failure_reason
from accel.kv_transfer.tt_layout import gather_tt, scatter_tt
from accel.tt.block_allocator import BlockAllocator
from accel.tt.request_state import RequestState

logger = logging.getLogger(__name__)


class KVTransferHooks:
    """``model_dir``: the engine's checkpoint (its fingerprint must match a payload's); dtype,
    layer count and KV shape are read from the lane's KV tensors."""

    def __init__(
        self,
        transport: KVTransport,
        model_dir: str,
        put_timeout_s: float = 5.0,
        fetch_timeout_s: float = 5.0,
        share_prefixes: bool = False,
    ):
        self.transport = transport
        self.fingerprint = model_fingerprint(model_dir)
        self.put_timeout_s = put_timeout_s
        self.fetch_timeout_s = fetch_timeout_s
        self.share_prefixes = share_prefixes
        self._offered: set[int] = set()  # block hashes this engine already gave the prefix tier
        self._lock = threading.Lock()
        self._prefetched: dict[str, KVPayload | Exception] = {}  # request id -> fetched (asyncio side)
        self.num_exported_tokens = 0
        self.num_imported_tokens = 0
        self.num_tier_tokens = 0  # imported from the prefix tier

    # ---- export -------------------------------------------------------------------------
    def on_finished(self, r: RequestState, lane_kv: Any) -> KVTransferParams | None:
        if self.share_prefixes:
            try:
                self._offer_prefix(r, lane_kv)
            except Exception:  # sharing is best effort; the request's outcome does not depend on it
                logger.warning("prefix tier offer for %s failed", r.req_id, exc_info=True)
        kv = r.request.kv_transfer
        if kv is None or not kv.do_remote_decode:
            return None
        tokens = r.request.prompt_token_ids
        transfer_id = kv.transfer_id or kv_params.new_transfer_id(r.req_id)
        try:
            payload = KVPayload(self._descriptor(lane_kv, tokens), gather_tt(lane_kv, r.block_ids, len(tokens)))
            self.transport.put(transfer_id, payload, self.put_timeout_s)
        except Exception as e:
            logger.warning(
                "KV export of %s (transfer %s) failed; the decode side will recompute: %s", r.req_id, transfer_id, e
            )
            return None
        self.num_exported_tokens += len(tokens)
        return kv_params.exported(transfer_id, len(tokens))

    # ---- import -------------------------------------------------------------------------
    def may_import(self, r: RequestState) -> bool:
        kv = r.request.kv_transfer
        return self.share_prefixes or (kv is not None and kv.do_remote_prefill)

    def on_added(self, r: RequestState, allocator: BlockAllocator, lane_kv: Any) -> None:
        kv = r.request.kv_transfer
        transfer_id = kv.transfer_id if kv is not None and kv.do_remote_prefill else None  # (prefill implies one)
        if transfer_id is None:
            if self.share_prefixes:
                self._pull_prefix(r, allocator, lane_kv)
            return
        payload = self._fetch(r.request, lane_kv)
        if payload is None:
            return
        try:
            num_tokens = self._import_prefix(allocator, lane_kv, r.request, payload)
        except Exception:  # never fail the request over an import: prefill it instead
            logger.exception("KV import of %s failed, recomputing", r.req_id)
            self.transport.report_recompute("import_error")
            return
        wanted = (
            min(payload.descriptor.num_tokens, r.num_prompt_tokens - 1) // allocator.block_size * allocator.block_size
        )
        if num_tokens == wanted and payload.descriptor.num_tokens >= r.num_prompt_tokens - 1:
            num_tokens += _preload_tail(r, allocator, lane_kv, payload.kv, num_tokens)
        self.transport.complete(transfer_id)
        self.num_imported_tokens += num_tokens
        if num_tokens < wanted:
            logger.warning(
                "request %s: imported %d of %d transferable tokens (no room); recomputing the rest",
                r.req_id,
                num_tokens,
                wanted,
            )
            self.transport.report_recompute("no_room")

    async def prefetch(self, request: GenerateRequest) -> None:
        """Asyncio side, before the request reaches the engine thread: the network part of an
        import (actor RPC, object-store read), so a slow or dead actor never stalls the step loop.
        ``on_added`` then validates and copies; without a prefetch it fetches itself."""
        kv = request.kv_transfer
        if kv is None or not kv.do_remote_prefill or kv.transfer_id is None:  # (prefill implies an id)
            return
        payload: KVPayload | Exception
        try:
            payload = await asyncio.to_thread(self.transport.fetch, kv.transfer_id, self.fetch_timeout_s)
        except Exception as e:
            payload = e
        with self._lock:
            self._prefetched[request.request_id] = payload

    def _fetch(self, request: GenerateRequest, lane_kv: Any) -> KVPayload | None:
        assert request.kv_transfer is not None and request.kv_transfer.transfer_id is not None  # see on_added
        transfer_id = request.kv_transfer.transfer_id
        with self._lock:
            prefetched = self._prefetched.pop(request.request_id, None)
        try:
            if isinstance(prefetched, Exception):
                raise prefetched
            payload = prefetched or self.transport.fetch(transfer_id, self.fetch_timeout_s)
            key = lane_kv[0][0]  # (num_blocks, Hkv, block_size, D)
            payload.descriptor.check_compatible(self.fingerprint, key.dtype, len(lane_kv), key.shape[1], key.shape[3])
            payload.descriptor.check_prompt(request.prompt_token_ids)
            return payload
        except Exception as e:
            logger.warning("KV import of %s (transfer %s) failed, recomputing: %s", request.request_id, transfer_id, e)
            self.transport.report_recompute(failure_reason(e))
            return None

    @staticmethod
    def _import_prefix(allocator: BlockAllocator, lane_kv: Any, request: GenerateRequest, payload: KVPayload) -> int:
        """Write the payload's full blocks into ``allocator``'s prefix cache; the tokens now cached."""
        bs = allocator.block_size
        tokens = request.prompt_token_ids
        num_blocks = min(payload.descriptor.num_tokens, len(tokens) - 1) // bs  # never the last token
        hashes = hash_prompt_blocks(tokens[: num_blocks * bs], bs, salted_root(request.cache_salt))
        if not allocator.enable_prefix_caching or not hashes:
            return 0
        num_cached = len(allocator.find_cached_prefix(hashes))
        return _cache_blocks(allocator, lane_kv, hashes, num_cached, payload.kv[:, :, num_cached * bs :])

    # ---- prefix tier --------------------------------------------------------------------
    def _tier_key(self, lane_kv: Any) -> str:
        return f"{self.fingerprint}:{lane_kv[0][0].dtype}"

    def _offer_prefix(self, r: RequestState, lane_kv: Any) -> None:
        bs = lane_kv[0][0].shape[2]
        hashes = hash_prompt_blocks(r.request.prompt_token_ids, bs, salted_root(r.request.cache_salt))
        new = [i for i, h in enumerate(hashes) if h not in self._offered]
        if not new:
            return
        kv = gather_tt(lane_kv, r.block_ids, len(hashes) * bs)  # [L, 2, T, Hkv, D]
        blocks = [kv[:, :, i * bs : (i + 1) * bs].clone() for i in new]
        if self.transport.offer_prefix(self._tier_key(lane_kv), bs, [hashes[i] for i in new], blocks):
            self._offered.update(hashes[i] for i in new)

    def _pull_prefix(self, r: RequestState, allocator: BlockAllocator, lane_kv: Any) -> None:
        bs = allocator.block_size
        tokens = r.request.prompt_token_ids
        # never the last token
        hashes = hash_prompt_blocks(tokens[: (len(tokens) - 1) // bs * bs], bs, salted_root(r.request.cache_salt))
        if not allocator.enable_prefix_caching or not hashes:
            return
        num_cached = len(allocator.find_cached_prefix(hashes))
        if num_cached == len(hashes):
            return
        try:
            blocks = self.transport.match_prefix(
                self._tier_key(lane_kv), bs, hashes, lane_kv[0][0].dtype, self.fetch_timeout_s
            )
            if len(blocks) <= num_cached:
                return
            kv = torch.cat(blocks[num_cached:], dim=2)
            num_tokens = _cache_blocks(allocator, lane_kv, hashes[: len(blocks)], num_cached, kv)
        except Exception:
            logger.warning("prefix tier import for %s failed; prefilling it", r.req_id, exc_info=True)
            return
        self.num_tier_tokens += num_tokens - num_cached * bs

    def _descriptor(self, lane_kv: Any, tokens: tuple[int, ...]) -> KVDescriptor:
        key = lane_kv[0][0]
        return KVDescriptor.for_prompt(
            self.fingerprint, key.dtype, len(lane_kv), key.shape[1], key.shape[3], tokens, key.shape[2]
        )


def _preload_tail(
    r: RequestState, allocator: BlockAllocator, lane_kv: Any, kv: torch.Tensor, num_full_tokens: int
) -> int:
    """Every full block of ``r``'s prompt but the last token's is cached: write the rest of the
    prompt's KV up to (not including) its last token — the partial last block — into a fresh block
    of ``allocator`` held by ``r`` and mark ``r`` preloaded, so admission puts it straight into decode
    (the last prompt token is its first decode input) instead of prefilling that block. Returns
    the tokens written (0 when there is no room for the block: ``r`` is then prefilled as usual)."""
    num_tail = r.num_prompt_tokens - 1 - num_full_tokens  # 0 <= num_tail < block_size
    if num_tail > 0:
        if allocator.num_free_blocks < 1:
            return 0
        block = allocator.allocate(1)[0]
        # A page table whose positions [num_full_tokens, +block_size) map to the new block.
        table = [0] * (num_full_tokens // allocator.block_size) + [block]
        scatter_tt(lane_kv, table, kv[:, :, num_full_tokens : num_full_tokens + num_tail], start_token=num_full_tokens)
        r.preloaded_block = block
    r.is_kv_preloaded = True
    return num_tail


def _cache_blocks(allocator: BlockAllocator, lane_kv: Any, hashes: list[int], num_cached: int, kv: torch.Tensor) -> int:
    """Blocks ``num_cached..len(hashes)`` (their KV = ``kv`` ``[L, 2, >=n*bs, Hkv, D]`` from block
    ``num_cached`` on) into fresh blocks of ``allocator``, registered in its prefix cache and released
    to the LRU queue (admission takes them as a hit). Returns the prefix tokens now cached."""
    bs = allocator.block_size
    num_new = min(len(hashes) - num_cached, allocator.num_free_blocks)
    if num_new > 0:
        blocks = allocator.allocate(num_new)
        lo = num_cached * bs
        # A page table whose positions [lo, lo + num_new * bs) map to the new blocks.
        scatter_tt(lane_kv, [0] * num_cached + blocks, kv[:, :, : num_new * bs], start_token=lo)
        allocator.cache_blocks(blocks, hashes[num_cached : num_cached + num_new])
        allocator.free(blocks)
    return (num_cached + max(num_new, 0)) * bs
