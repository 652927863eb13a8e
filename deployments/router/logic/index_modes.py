"""The prefix index modes by name (``router.index_mode``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from accel.contract import ConfigError

from .precise_index import PrecisePrefixIndex
from .prefix_index import ApproximatePrefixIndex, PrefixIndex

PREFIX_INDEX_MODES: dict[str, type[PrefixIndex]] = {
    cls.mode: cls for cls in (ApproximatePrefixIndex, PrecisePrefixIndex)
}


def make_prefix_index(
    mode: str, clock: Callable[[], float] = time.monotonic, speculative_ttl_s: float = 0.0
) -> PrefixIndex:
    """The index for ``mode``; an unknown name raises ``ConfigError`` listing the known ones.
    ``clock`` and ``speculative_ttl_s``: the precise index's speculative entries."""
    cls = PREFIX_INDEX_MODES.get(mode)
    if cls is None:
        raise ConfigError(f"router.index_mode: unknown mode {mode!r}; known: {', '.join(sorted(PREFIX_INDEX_MODES))}")
    if cls is PrecisePrefixIndex:
        return PrecisePrefixIndex(clock, speculative_ttl_s)
    return cls()
