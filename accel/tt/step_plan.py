"""The boundary between scheduling and execution: one frozen ``StepPlan`` per engine step.

The lane coordinator produces it; the runner turns it into the one mesh-model call of the step;
the engine core applies the result to the request states. Rows carry everything the runner
needs (full token row for prefill, one token for decode), so the runner keeps no scheduling
state of its own beyond per-request sampler generators (dropped via ``finished_req_ids``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

from accel.contract import SamplingParams

# A decode row's input token that the previous, still in-flight step samples for the same row
# (async decode). The runner fills it from that step's output before submitting.
PENDING_TOKEN = -1


class StepMode(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    EMPTY = "empty"


class RowPlan(NamedTuple):
    """One request's work in a step. (A NamedTuple rather than a frozen dataclass: one is built
    per running request per step, and this is the hot path at 128 rows.)"""

    req_id: str
    lane: int
    row: int  # global slot = lane * per_lane + local slot
    start_pos: int  # tokens already in KV (prefix hit, earlier chunks)
    end_pos: int  # end of the scheduled chunk (the model's prompt_lens)
    # prefill: tokens[0:end_pos] (the model reads [start_pos:end_pos]);
    # decode: the single token at start_pos, or PENDING_TOKEN.
    input_token_ids: tuple[int, ...]
    block_ids: tuple[int, ...]  # lane-local page table, covers end_pos tokens
    samples: bool  # the chunk reaches the end of the known tokens
    sampling: SamplingParams
    num_output_tokens: int  # outputs before this step's token (for min_tokens)
    # prompt + outputs, only when the row needs penalties on the host (PENDING_TOKEN-padded).
    history_token_ids: tuple[int, ...] | None = None
    # prefill rows of a request with images: its images (``accel.tt.multimodal.ImageInput``),
    # whose placeholder tokens are in ``input_token_ids``; None for text rows and decode rows.
    images: tuple[Any, ...] | None = None

    @property
    def num_scheduled_tokens(self) -> int:
        return self.end_pos - self.start_pos


@dataclass(frozen=True)
class StepPlan:
    step_id: int
    mode: StepMode
    per_lane: int  # slots per lane
    num_lanes: int
    rows: tuple[RowPlan, ...]  # sorted by row; prefill rows are front-packed in this order
    finished_req_ids: frozenset[str] = frozenset()  # since the previous plan: drop cached state
    preempted_req_ids: frozenset[str] = frozenset()  # preempted while planning this step
    is_decode_retry: bool = False  # a zero-token prefill pass was redone as decode

    @property
    def capacity(self) -> int:
        """Decode rows on the wire (B_wire)."""
        return self.per_lane * self.num_lanes

    @property
    def is_decode(self) -> bool:
        return self.mode is StepMode.DECODE

    @cached_property
    def layout(self) -> tuple[tuple[int, str], ...]:
        """``(row, req_id)`` per row: two decode steps with equal layouts run the same requests in
        the same slots (computed once per plan; the runner sends ``reset_batch`` when it changes)."""
        return tuple((r.row, r.req_id) for r in self.rows)

    @property
    def scheduled_req_ids(self) -> tuple[str, ...]:
        return tuple(r.req_id for r in self.rows)

    @property
    def scheduled_rows(self) -> tuple[int, ...]:
        return tuple(r.row for r in self.rows)

    @property
    def batch_size_per_dp(self) -> tuple[int, ...]:
        return (self.per_lane,) * self.num_lanes

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(r.num_scheduled_tokens for r in self.rows)

    def rows_of_lane(self, lane: int) -> tuple[RowPlan, ...]:
        return tuple(r for r in self.rows if r.lane == lane)
