"""Per-request engine state, owned by the engine thread (the request's text output state, its
``OutputBuilder``, lives with its consumer in ``TTMeshEngine.generate``).

Token accounting (one convention everywhere):
- ``token_ids`` = prompt + output tokens known on the host;
- ``num_pending`` = tokens sampled by submitted steps whose results are not applied yet
  (async decode); ``num_tokens = len(token_ids) + num_pending``;
- ``num_computed`` = positions whose KV has been written (or is being written by a submitted
  step); ``num_tokens - num_computed`` tokens still need a forward pass. A decode step computes
  exactly one (the last token); a prefill step computes a chunk and samples only when the chunk
  reaches ``num_tokens``.
Preemption (recompute) frees the blocks and resets ``num_computed`` to 0; the outputs stay, so
the resumed prefill covers prompt + outputs and samples the next token.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from accel.block_hash import BlockHash, hash_prompt_blocks, salted_root
from accel.contract import GenerateRequest, SamplingParams

if TYPE_CHECKING:
    from accel.structured.constraint import LogitsConstraint
    from accel.tt.multimodal import ImageInput


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued in its lane (new or preempted)
    RUNNING = "running"  # holds a slot and blocks
    FINISHED = "finished"  # done or aborted; holds nothing


@dataclass(eq=False)
class RequestState:
    request: GenerateRequest
    lane: int
    token_ids: list[int]
    status: RequestStatus = RequestStatus.WAITING
    num_computed: int = 0
    num_pending: int = 0
    slot: int | None = None  # global slot (lane * per_lane + local), while running
    block_ids: list[int] = field(default_factory=list)  # lane-local page table
    block_table: tuple[int, ...] = ()  # == tuple(block_ids), rebuilt only when blocks change
    block_hashes: list[BlockHash] = field(default_factory=list)  # of full blocks of token_ids
    num_cached_blocks: int = 0  # leading blocks registered in the prefix cache
    num_preemptions: int = 0
    num_prefix_hit_tokens: int = 0  # from the latest admission
    # A KV import (prefill/decode disaggregation) left the prompt's KV up to, not including, its
    # last token: full blocks in the lane's prefix cache, the partial tail in ``preloaded_block``
    # (None when the tail is empty). Admission adopts them and the request starts in a DECODE step
    # (its last prompt token is the decode input), never a prefill step. Cleared on admission.
    is_kv_preloaded: bool = False
    preloaded_block: int | None = None
    # Logit masks (structured outputs, allowed_token_ids, bad_words), advanced per output token;
    # None for unconstrained requests.
    constraint: LogitsConstraint | None = None
    # Its images, processed on the host (``accel.tt.multimodal.ImageInput``); () = text only.
    # Their placeholder tokens are in the prompt, so every prefill of it (a preemption's resume
    # too) passes them again.
    images: tuple[ImageInput, ...] = ()
    # Plain copies of request fields read on the per-step hot path (128 rows a step: a property
    # call per row per read adds up).
    req_id: str = field(init=False)
    num_prompt_tokens: int = field(init=False)
    sampling: SamplingParams = field(init=False)
    has_penalties: bool = field(init=False)

    def __post_init__(self) -> None:
        self.req_id = self.request.request_id
        self.num_prompt_tokens = self.request.num_prompt_tokens
        self.sampling = self.request.sampling
        self.has_penalties = self.sampling.has_penalties

    @classmethod
    def new(cls, request: GenerateRequest, lane: int = -1, images: tuple[ImageInput, ...] = ()) -> RequestState:
        return cls(request=request, lane=lane, token_ids=list(request.prompt_token_ids), images=images)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids) + self.num_pending

    @property
    def num_output_tokens(self) -> int:
        """Outputs sampled so far, including pending ones."""
        return self.num_tokens - self.num_prompt_tokens

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def is_prefilling(self) -> bool:
        """More than one token lacks KV: a (resumed or chunked) prefill is due."""
        return self.num_uncomputed > 1

    @property
    def is_decode_ready(self) -> bool:
        return self.num_uncomputed == 1

    def will_finish_by_length(self, max_model_len: int) -> bool:
        """Its pending tokens already reach max_tokens or max_model_len: scheduling another
        step would only compute a token that gets dropped."""
        sp = self.sampling
        if sp.max_tokens is not None and self.num_output_tokens >= sp.max_tokens:
            return True
        return self.num_tokens >= max_model_len

    def update_block_hashes(self, block_size: int) -> None:
        """Extend the chained hashes over every full block of known tokens."""
        start = len(self.block_hashes) * block_size
        num_full_tokens = len(self.token_ids) // block_size * block_size
        if num_full_tokens > start:
            parent = self.block_hashes[-1] if self.block_hashes else salted_root(self.request.cache_salt)
            self.block_hashes.extend(hash_prompt_blocks(self.token_ids[start:num_full_tokens], block_size, parent))
