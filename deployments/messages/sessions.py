"""A request's session key, as the ingress names it and the router binds it."""

from __future__ import annotations

from collections.abc import Mapping

SESSION_HEADER = "x-session-id"


def session_id_from(
    headers: Mapping[str, str] | None = None, user: str | None = None, prompt_cache_key: str | None = None
) -> str | None:
    """The request's session key: ``x-session-id`` header (any case), else ``user``, else
    ``prompt_cache_key``; ``None`` when none is set or all are empty."""
    if headers:
        for name, value in headers.items():
            if name.lower() == SESSION_HEADER and value:
                return value
    return user or prompt_cache_key or None
