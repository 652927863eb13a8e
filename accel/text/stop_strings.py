"""Stop strings that match across token boundaries.

Text arrives in deltas. A stop string may begin in one delta and end in a later one, so we hold
back the last ``max_len - 1`` characters (when the stop string itself is not to be shown) until
we know they do not start a stop string. Invariant: everything emitted is a prefix of the final
output, which is the generated text cut just before (or just after, with
``include_stop_str_in_output``) the earliest stop string.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StopMatch:
    text: str  # text safe to emit now
    stop_str: str | None  # the stop string that ended the output, if any


class StopStringMatcher:
    def __init__(self, stop: tuple[str, ...], include_stop_str_in_output: bool = False):
        self._stop = stop
        self._include = include_stop_str_in_output
        max_len = max((len(s) for s in stop), default=0)
        self._hold = 0 if include_stop_str_in_output else max(max_len - 1, 0)
        self._max_len = max_len
        self._text = ""  # all text seen so far (after trimming nothing)
        self._emitted = 0  # characters of _text already emitted

    def feed(self, delta: str) -> StopMatch:
        if not self._stop:
            return StopMatch(delta, None)
        search_from = max(0, len(self._text) - self._max_len + 1)
        self._text += delta
        best: tuple[int, str] | None = None
        for s in self._stop:
            pos = self._text.find(s, search_from)
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, s)
        if best is not None:
            pos, s = best
            end = pos + len(s) if self._include else pos
            out = self._text[self._emitted : end] if end > self._emitted else ""
            self._emitted = max(self._emitted, end)
            return StopMatch(out, s)
        safe_end = max(self._emitted, len(self._text) - self._hold)
        out = self._text[self._emitted : safe_end]
        self._emitted = safe_end
        return StopMatch(out, None)

    def flush(self) -> str:
        """The stream ended without a stop string: release what was held back."""
        out = self._text[self._emitted :]
        self._emitted = len(self._text)
        return out
