"""``KVTransferHooks``: prefill/decode KV transfer for the TT engine, through the KV-connector
actor in the canonical format. Implements ``accel.tt.engine_core.KVHookPoints``.

Export (``on_finished``, engine thread, a ``do_remote_decode`` request that finished normally and
still holds its blocks): gather the prompt's KV from the lane's pages into the canonical payload,
put it to the actor and return the ticket ``{do_remote_prefill, transfer_id, num_tokens}`` for the
final delta. The put is synchronous (one copy into the object store plus two small RPCs; waits
at most ``put_timeout_s`` when the actor is full): the ticket is only handed out once the payload
is committed, so the decode side never races the producer. A failed put returns no ticket and the
decode side recomputes.

Import (``on_added``, engine thread, the request was bound to its lane and nothing is scheduled):
fetch the payload named by ``do_remote_prefill``, refuse another model (fingerprint, dtype,
shapes) or other prompt tokens (block hashes), then write the prompt's full blocks into freshly
allocated blocks of the lane's pool, register them in its prefix cache under the prompt's chained
hashes and release them to the cache's LRU queue. Ordinary admission takes them as a prefix hit
(blocks reused, tokens marked computed) and prefills only the rest — at least the last prompt
token, whose logits are needed, and any partial last block — before decoding. Blocks the lane
already caches are not rewritten. Any failure (missing or expired transfer, dead actor,
mismatch, no free blocks) -> the prompt is prefilled locally and the actor counts a recompute.
"""

from __future__ import annotations

import logging
from typing import Any

from accel.block_hash import hash_prompt_blocks
from accel.contract import GenerateRequest, KVTransferParams
from accel.kv_transfer import params as kv_params
from accel.kv_transfer.fingerprint import model_fingerprint
from accel.kv_transfer.payload import KVDescriptor, KVPayload
from accel.kv_transfer.transport import KVTransport, failure_reason
from accel.kv_transfer.tt_layout import gather_tt, scatter_tt

logger = logging.getLogger(__name__)


class KVTransferHooks:
    """``model_dir``: the engine's checkpoint (its fingerprint must match a payload's); dtype,
    layer count and KV shape are read from the lane's KV tensors."""

    def __init__(self, transport: KVTransport, model_dir: str, put_timeout_s: float = 5.0,
                 fetch_timeout_s: float = 5.0):
        self.transport = transport
        self.fingerprint = model_fingerprint(model_dir)
        self.put_timeout_s = put_timeout_s
        self.fetch_timeout_s = fetch_timeout_s
        self.num_exported_tokens = 0
        self.num_imported_tokens = 0

    # ---- export -------------------------------------------------------------------------
    def on_finished(self, r: Any, lane_kv: Any) -> KVTransferParams | None:
        kv = r.request.kv_transfer
        if kv is None or not kv.do_remote_decode:
            return None
        tokens = r.request.prompt_token_ids
        transfer_id = kv.transfer_id or kv_params.new_transfer_id(r.req_id)
        try:
            payload = KVPayload(self._descriptor(lane_kv, tokens), gather_tt(lane_kv, r.block_ids, len(tokens)))
            self.transport.put(transfer_id, payload, self.put_timeout_s)
        except Exception as e:
            logger.warning("KV export of %s (transfer %s) failed; the decode side will recompute: %s",
                           r.req_id, transfer_id, e)
            return None
        self.num_exported_tokens += len(tokens)
        return kv_params.exported(transfer_id, len(tokens))

    # ---- import -------------------------------------------------------------------------
    def on_added(self, r: Any, pool: Any, lane_kv: Any) -> None:
        kv = r.request.kv_transfer
        if kv is None or not kv.do_remote_prefill or not kv.transfer_id:
            return
        payload = self._fetch(r.request, lane_kv)
        if payload is None:
            return
        num_tokens = self._import_prefix(pool, lane_kv, r.request, payload)
        self.transport.complete(kv.transfer_id)
        self.num_imported_tokens += num_tokens
        wanted = min(payload.descriptor.num_tokens, r.num_prompt_tokens - 1) // pool.block_size * pool.block_size
        if num_tokens < wanted:
            logger.warning("request %s: imported %d of %d transferable tokens (no room); recomputing the rest",
                           r.req_id, num_tokens, wanted)
            self.transport.report_recompute("no_room")

    def _fetch(self, request: GenerateRequest, lane_kv: Any) -> KVPayload | None:
        transfer_id = request.kv_transfer.transfer_id
        try:
            payload = self.transport.fetch(transfer_id, self.fetch_timeout_s)
            key = lane_kv[0][0]  # (num_blocks, Hkv, block_size, D)
            payload.descriptor.check_compatible(self.fingerprint, key.dtype, len(lane_kv), key.shape[1], key.shape[3])
            payload.descriptor.check_prompt(request.prompt_token_ids)
            return payload
        except Exception as e:
            logger.warning("KV import of %s (transfer %s) failed, recomputing: %s", request.request_id,
                           transfer_id, e)
            self.transport.report_recompute(failure_reason(e))
            return None

    @staticmethod
    def _import_prefix(pool: Any, lane_kv: Any, request: GenerateRequest, payload: KVPayload) -> int:
        """Write the payload's full blocks into ``pool``'s prefix cache; the tokens now cached."""
        bs = pool.block_size
        tokens = request.prompt_token_ids
        num_blocks = min(payload.descriptor.num_tokens, len(tokens) - 1) // bs  # never the last token
        hashes = hash_prompt_blocks(tokens[:num_blocks * bs], bs)
        if not pool.enable_prefix_caching or not hashes:
            return 0
        num_cached = len(pool.find_cached_prefix(hashes))
        num_new = min(num_blocks - num_cached, pool.num_free_blocks)
        if num_new > 0:
            blocks = pool.allocate(num_new)
            lo, hi = num_cached * bs, (num_cached + num_new) * bs
            # A page table whose positions [lo, hi) map to the new blocks (earlier ones unused).
            scatter_tt(lane_kv, [0] * num_cached + blocks, payload.kv[:, :, lo:hi], start_token=lo)
            pool.cache_blocks(blocks, hashes[num_cached:num_cached + num_new])
            pool.free(blocks)  # cached and free: the request's admission takes them as a hit
        return (num_cached + max(num_new, 0)) * bs

    def _descriptor(self, lane_kv: Any, tokens: tuple[int, ...]) -> KVDescriptor:
        key = lane_kv[0][0]
        return KVDescriptor.for_prompt(self.fingerprint, key.dtype, len(lane_kv), key.shape[1], key.shape[3],
                                       tokens, key.shape[2])
