"""One request's logit constraints on a host-sampling engine: a grammar matcher (structured
outputs), ``allowed_token_ids`` and ``bad_words``, in vLLM's order (the grammar bitmask first,
then the allow-list, then bad words; logits processors and penalties come after, in the sampler).

``LogitsConstraint`` is owned by the engine thread: ``mask_grammar`` and ``mask_token_lists``
write -inf into the logits of the tokens a row may not sample next; ``accept`` advances it by the
token that row sampled. The grammar's stop tokens are the request's eos and stop token ids (vLLM's
``all_stop_token_ids``): once the grammar is complete only they are allowed, so a finished grammar
finishes the request through the ordinary token stop. Once a stop token is accepted the matcher is
terminated and the row is no longer masked (vLLM fills a full bitmask for terminated grammars).

With ``reasoning_end_token_ids`` the grammar waits until the output contains that sequence (a
reasoning model's end-of-thinking marker) and constrains from the next token on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import torch
import xgrammar as xgr

from accel.contract import SamplingParams

logger = logging.getLogger(__name__)


class LogitsConstraint:
    def __init__(
        self,
        sampling: SamplingParams,
        compiled: xgr.CompiledGrammar | None,
        stop_token_ids: Iterable[int],
        vocab_size: int,
    ):
        self.vocab_size = vocab_size
        spec = sampling.structured_outputs
        self.matcher: xgr.GrammarMatcher | None = None
        if spec is not None:
            assert compiled is not None, "a structured-output request needs its compiled grammar"
            self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=sorted(set(stop_token_ids)))
        self._reasoning_end = spec.reasoning_end_token_ids if spec is not None else ()
        self.is_reasoning_done = not self._reasoning_end
        self.is_failed = False  # the grammar rejected a sampled token: no longer constrained
        # allow-list as a "banned" mask (True = -inf), built once
        self.banned: torch.Tensor | None = None
        if sampling.allowed_token_ids is not None:
            self.banned = torch.ones(vocab_size, dtype=torch.bool)
            self.banned[[t for t in sampling.allowed_token_ids if t < vocab_size]] = False
        self.bad_words = sampling.bad_words_token_ids
        self.output_token_ids: list[int] = []  # every accepted output token (bad words, reasoning end)

    @property
    def uses_grammar(self) -> bool:
        """The grammar masks the next token (armed, not terminated, not failed)."""
        m = self.matcher
        return m is not None and self.is_reasoning_done and not self.is_failed and not m.is_terminated()

    @property
    def is_terminated(self) -> bool:
        return self.matcher is not None and self.matcher.is_terminated()

    def accept(self, token_id: int) -> None:
        """The row sampled ``token_id``: advance the grammar (once armed) and the bad-word history."""
        self.output_token_ids.append(token_id)
        if self.matcher is None or self.is_failed:
            return
        if not self.is_reasoning_done:
            end = self._reasoning_end
            self.is_reasoning_done = tuple(self.output_token_ids[-len(end) :]) == end
            return
        if self.matcher.is_terminated():
            return
        if not self.matcher.accept_token(token_id):
            # vLLM logs the same and goes on; the output is no longer guaranteed to match.
            logger.error("grammar rejected sampled token %d; the request continues unconstrained", token_id)
            self.is_failed = True

    def banned_bad_word_tokens(self) -> list[int]:
        """vLLM's ``_apply_bad_words_single_batch``: the last token of every bad word whose other
        tokens are the tail of the output so far."""
        out = self.output_token_ids
        banned = []
        for word in self.bad_words:
            if len(word) > len(out) + 1:
                continue
            prefix = word[:-1]
            if not prefix or tuple(out[-len(prefix) :]) == prefix:
                banned.append(word[-1])
        return banned


def mask_grammar(logits: torch.Tensor, constraints: Sequence[LogitsConstraint | None]) -> None:
    """The grammar bitmask, in place on float logits ``[n, vocab]`` (row i <-> ``constraints[i]``;
    None = free). vLLM applies it before the sampler, so its raw logprobs see it."""
    grammar_rows = [i for i, c in enumerate(constraints) if c is not None and c.uses_grammar]
    if not grammar_rows:
        return
    vocab = logits.shape[-1]
    bitmask = xgr.allocate_token_bitmask(len(constraints), vocab)  # all allowed until filled
    for i in grammar_rows:
        matcher = constraints[i].matcher  # type: ignore[union-attr]
        assert matcher is not None
        matcher.fill_next_token_bitmask(bitmask, i)
    xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab, indices=grammar_rows)


def mask_token_lists(logits: torch.Tensor, constraints: Sequence[LogitsConstraint | None]) -> None:
    """``allowed_token_ids`` then ``bad_words``, in place (the sampler's first logits processors)."""
    vocab = logits.shape[-1]
    for i, c in enumerate(constraints):
        if c is None:
            continue
        if c.banned is not None:
            width = min(c.banned.shape[0], vocab)
            logits[i, :width].masked_fill_(c.banned[:width], float("-inf"))
        if c.bad_words:
            banned = [t for t in c.banned_bad_word_tokens() if t < vocab]
            if banned:
                logits[i, banned] = float("-inf")
