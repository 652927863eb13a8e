"""Incremental detokenization as vLLM 0.32 does it (``vllm/v1/engine/detokenizer.py``,
``FastIncrementalDetokenizer``): the tokenizers library's ``DecodeStream``, primed with the
prompt's token ids so the first output token decodes in the prompt's context (a SentencePiece
leading space is kept; a character split between prompt and output comes out whole).

``DecodeStream`` holds back a token whose text ends in an incomplete UTF-8 sequence until a
later token completes it. What is still held back when the request ends is never emitted,
exactly as vLLM's server never emits it (its final text is the concatenation of the deltas), so
greedy text is identical to vLLM's and there is nothing to flush at the end.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

logger = logging.getLogger(__name__)

# tokenizers' error for a prefix that decodes to non-monotonic / invalid UTF-8 (vLLM's
# INVALID_PREFIX_ERR_MSG); the stream is then restarted without context, as vLLM does.
_INVALID_PREFIX = "Invalid prefix encountered"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True, prompt_token_ids: Sequence[int] = ()):
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._stream = DecodeStream(ids=list(prompt_token_ids), skip_special_tokens=skip_special_tokens)

    def step(self, new_ids: Iterable[int]) -> str:
        """Append tokens; return the text they completed ("" while a character is incomplete)."""
        return "".join(self._step_one(token_id) or "" for token_id in new_ids)

    def _step_one(self, token_id: int) -> str | None:
        try:
            return self._stream.step(self._tokenizer, token_id)
        except (OverflowError, TypeError):
            logger.exception("invalid token id %r", token_id)
            return None
        except Exception as exc:
            if not str(exc).startswith(_INVALID_PREFIX):
                raise
            logger.warning("invalid prefix while detokenizing; restarting the decode stream")
            self._stream = DecodeStream(skip_special_tokens=self._skip_special)
            return self._stream.step(self._tokenizer, token_id)
