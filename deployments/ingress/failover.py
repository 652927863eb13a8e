"""Mid-stream failover of one engine request: what the ingress needs to move a stream whose replica
died after tokens were sent to another replica, so the client's stream continues without a seam.

``StreamProgress`` watches the deltas passed on to the client. After a death it builds the
continuation: the original prompt + every token already sent as the new prompt, the rest of the
budget (``max_tokens`` and ``min_tokens`` less the tokens sent), a new engine request id
(``<id>#failover<k>``) and no KV-transfer ticket. The continuation's deltas are rewritten into the
original request's terms (its id, its prompt length, completion counts that include the tokens
sent before, the first attempt's cached-token count), so usage counts the original prompt once.

Why the output is the one an uninterrupted run gives:
- greedy: the next token depends only on the token sequence so far, which the new prompt is;
- seeded sampling on the TT engine: its generator is seeded by (seed, position of the sampled
  token) (``accel/tt/host_sampler.py``), and positions continue where they stopped, so the
  continuation draws what the dead replica would have drawn. vLLM's seeded generator is seeded
  once per request and advanced per step: there the continuation is deterministic (the same
  seed gives the same continuation) but not the uninterrupted run's draw.
Not carried over (documented limits): presence/frequency penalties count only the continuation's
own output tokens; a stop string straddling the failover point is not seen; a character whose
UTF-8 bytes span the failover point may come out as the replacement character.
"""

from __future__ import annotations

import dataclasses

from accel.contract import FinishReason, GenerateRequest, OutputDelta

FAILOVER_REQUEST_ID_SUFFIX = "#failover"


@dataclasses.dataclass
class StreamProgress:
    """The tokens of ``request`` passed on so far, and the rewriting of continuation deltas."""

    request: GenerateRequest
    token_ids: list[int] = dataclasses.field(default_factory=list)
    num_cached_tokens: int = 0
    finished: bool = False
    # Tokens sent before the current attempt started (0 on the first attempt).
    _offset: int = 0
    _is_first_attempt: bool = True

    @property
    def started(self) -> bool:
        """Whether tokens were passed on (a death now needs a continuation, not a plain retry)."""
        return bool(self.token_ids)

    def pass_on(self, delta: OutputDelta) -> OutputDelta:
        """``delta`` of the current attempt, in the original request's terms; recorded as sent."""
        if not self._is_first_attempt:
            delta = dataclasses.replace(
                delta,
                request_id=self.request.request_id,
                num_prompt_tokens=self.request.num_prompt_tokens,
                num_completion_tokens=self._offset + delta.num_completion_tokens,
                num_cached_tokens=self.num_cached_tokens,
            )
        else:
            self.num_cached_tokens = delta.num_cached_tokens
        self.token_ids.extend(delta.new_token_ids)
        self.finished = delta.finished
        return delta

    def continuation(self, attempt: int) -> GenerateRequest | None:
        """The request that continues the stream on another replica (attempt >= 1); None when the
        budget is spent (the caller ends the stream with ``length_end``)."""
        sent = len(self.token_ids)
        sp = self.request.sampling
        if sp.max_tokens is not None and sp.max_tokens - sent < 1:
            return None
        sampling = dataclasses.replace(
            sp,
            max_tokens=None if sp.max_tokens is None else sp.max_tokens - sent,
            min_tokens=max(0, sp.min_tokens - sent),
        )
        self._offset = sent
        self._is_first_attempt = False
        return dataclasses.replace(
            self.request,
            request_id=f"{self.request.request_id}{FAILOVER_REQUEST_ID_SUFFIX}{attempt}",
            prompt_token_ids=self.request.prompt_token_ids + tuple(self.token_ids),
            sampling=sampling,
            kv_transfer=None,
        )

    def length_end(self) -> OutputDelta:
        """The final delta of a stream whose replica died after its last token, before its finish."""
        self.finished = True
        return OutputDelta(
            request_id=self.request.request_id,
            new_token_ids=(),
            text="",
            num_prompt_tokens=self.request.num_prompt_tokens,
            num_completion_tokens=len(self.token_ids),
            num_cached_tokens=self.num_cached_tokens,
            finish_reason=FinishReason.LENGTH,
        )
