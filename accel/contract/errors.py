"""The two errors the contract raises, and the check every contract type validates with."""

from __future__ import annotations

import math
from typing import Any


class InvalidRequestError(ValueError):
    """A request field holds a value no engine accepts. ``field`` names it (OpenAI's ``param``)."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message

    def __reduce__(self) -> tuple[type[InvalidRequestError], tuple[str, str]]:
        # Raised in an engine replica, it crosses a process boundary pickled; the default
        # reduce would call __init__ with the formatted message alone.
        return InvalidRequestError, (self.field, self.message)


class ConfigError(ValueError):
    """A configuration value is wrong. The message names the key (and the file, when known)."""


def require(cond: bool, field_name: str, message: str) -> None:
    """Raise ``InvalidRequestError(field_name, message)`` unless ``cond``."""
    if not cond:
        raise InvalidRequestError(field_name, message)


def is_int(value: Any) -> bool:
    """An ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite ``int`` or ``float`` (not a ``bool``)."""
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


def normalize_token_ids(values: Any, field_name: str) -> tuple[int, ...]:
    """``values`` (None, a list or a tuple of non-negative ints) as a tuple; anything else raises."""
    if values is None:
        return ()
    require(isinstance(values, (list, tuple)), field_name, "expected a list of token ids")
    for v in values:
        require(is_int(v) and v >= 0, field_name, f"token ids must be non-negative integers, got {v!r}")
    return tuple(values)
