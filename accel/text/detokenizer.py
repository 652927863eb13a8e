"""Incremental detokenization that never emits a broken UTF-8 sequence.

Byte-level BPE tokens are byte strings: one character can span several tokens. We decode a
window that starts at the last point where the text was known to be complete (``_prefix``) and
emit only what lies past the previously emitted point (``_read``), and only when the window does
not end in U+FFFD (an incomplete multi-byte sequence). Invariant: ``ids[:_prefix]`` and
``ids[:_read]`` both end on a character boundary, so decode(ids) == emitted text + decode of the
tail, which is what ``flush`` emits at the end.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import Tokenizer

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window (a character boundary)
        self._read = 0  # end of what was already emitted (a character boundary)

    @property
    def token_ids(self) -> Sequence[int]:
        return self._ids

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=self._skip_special)

    def step(self, new_ids: Iterable[int]) -> str:
        """Append tokens; return the text they completed ("" while a character is incomplete)."""
        self._ids.extend(new_ids)
        if len(self._ids) == self._read:
            return ""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        window_text = self._decode(self._ids[self._prefix :])
        if len(window_text) <= len(prefix_text) or window_text.endswith(_REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return window_text[len(prefix_text) :]

    def flush(self) -> str:
        """At the end of the stream: whatever is still held back, incomplete bytes included."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        window_text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return window_text[len(prefix_text) :]
