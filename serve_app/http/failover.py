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
The continuation's text is made here from its token ids (``_TextTail``), primed with the tokens
sent, so text held back by the dead replica (an incomplete character, a possible stop-string
prefix) still comes out, a stop string straddling the failover point ends the stream there, and
the seam decodes in context. The continuation names the tokens sent as its resumed output
(``GenerateRequest.resumed_output_token_ids``): a structured-output grammar and the bad-word history
resume over them (the TT engine); an engine that cannot resume a grammar refuses the continuation,
which ends the stream with that error (vLLM). Not carried over (documented limit): presence/frequency penalties
count only the continuation's own output tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tokenizers import Tokenizer

from accel.contract import FinishReason, GenerateRequest, OutputDelta
from accel.text.detokenizer import IncrementalDetokenizer
from accel.text.stop_strings import StopStringMatcher

FAILOVER_REQUEST_ID_SUFFIX = "#failover"


class _TextTail:
    """The continuation's text, made here as the engine's output builder makes it
    (``accel/text/output_builder.py``: incremental detokenizer -> stop-string matcher), primed
    with the tokens already sent: the dead replica's held-back bytes and stop-string prefixes are
    held here too, a stop string straddling the failover point is found, and the seam decodes in
    the context of the tokens before it (an engine would decode the continuation's first token
    without them, e.g. dropping a SentencePiece leading space)."""

    def __init__(self, tokenizer: Tokenizer, request: GenerateRequest, sent: Sequence[int]):
        sp = request.sampling
        self._detok = IncrementalDetokenizer(tokenizer, sp.skip_special_tokens, request.prompt_token_ids)
        self._stops = StopStringMatcher(sp.stop, sp.include_stop_str_in_output)
        for token_id in sent:  # what the dead replica had emitted is discarded; its hold is kept
            self._stops.feed(self._detok.step([token_id]))

    def feed(self, token_ids: Sequence[int], finished: bool) -> tuple[int, str, str | None]:
        """(tokens kept, their text, the stop string that ends the stream here or None)."""
        parts: list[str] = []
        for i, token_id in enumerate(token_ids):
            match = self._stops.feed(self._detok.step([token_id]))
            parts.append(match.text)
            if match.stop_str is not None:
                return i + 1, "".join(parts), match.stop_str
        if finished:
            parts.append(self._stops.flush())
        return len(token_ids), "".join(parts), None


@dataclasses.dataclass
class StreamProgress:
    """The tokens of ``request`` passed on so far, and the rewriting of continuation deltas.
    ``tokenizer``: the model's (the continuation's text is made here, ``_TextTail``); None keeps
    the engine's text."""

    request: GenerateRequest
    tokenizer: Tokenizer | None = None
    token_ids: list[int] = dataclasses.field(default_factory=list)
    num_cached_tokens: int = 0
    finished: bool = False
    _is_first_attempt: bool = True
    _tail: _TextTail | None = None

    @property
    def started(self) -> bool:
        """Whether tokens were passed on (a death now needs a continuation, not a plain retry)."""
        return bool(self.token_ids)

    def pass_on(self, delta: OutputDelta) -> OutputDelta:
        """``delta`` of the current attempt, in the original request's terms; recorded as sent."""
        if self._is_first_attempt:
            self.num_cached_tokens = delta.num_cached_tokens
        else:
            changes: dict[str, object] = {}
            if self._tail is not None:
                kept, text, stop = self._tail.feed(delta.new_token_ids, delta.finished)
                changes.update(new_token_ids=delta.new_token_ids[:kept], text=text)
                if delta.logprobs is not None:
                    changes["logprobs"] = delta.logprobs[:kept]
                if stop is not None:
                    changes.update(finish_reason=FinishReason.STOP, stop_reason=stop)
                num_new = kept
            else:
                num_new = len(delta.new_token_ids)
            delta = dataclasses.replace(
                delta,
                request_id=self.request.request_id,
                num_prompt_tokens=self.request.num_prompt_tokens,
                num_completion_tokens=len(self.token_ids) + num_new,
                num_cached_tokens=self.num_cached_tokens,
                **changes,  # type: ignore[arg-type]
            )
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
        self._is_first_attempt = False
        if self.tokenizer is not None:
            self._tail = _TextTail(self.tokenizer, self.request, self.token_ids)
        return dataclasses.replace(
            self.request,
            request_id=f"{self.request.request_id}{FAILOVER_REQUEST_ID_SUFFIX}{attempt}",
            prompt_token_ids=self.request.prompt_token_ids + tuple(self.token_ids),
            # the engine resumes the grammar over these instead of restarting it (never silently)
            resumed_output_token_ids=self.request.resumed_output_token_ids + tuple(self.token_ids),
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
