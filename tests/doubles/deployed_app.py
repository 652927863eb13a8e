"""One app deployed on the test session's Serve for the length of a ``with`` block."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.doubles.handle_loop import wait_until_router_knows


@contextmanager
def deployed_app(
    serve_url: str,
    name: str,
    args: dict[str, Any],
    route_prefix: str | None = None,
    *,
    engine_replicas: int = 0,
    timeout_s: float = 60,
) -> Iterator[str]:
    """``build_app(args)`` run as app ``name`` at ``route_prefix`` (default ``/<name>``); yields
    its base URL once the router has seen ``engine_replicas`` engine replicas (0: no wait), and
    deletes the app on the way out."""
    from ray import serve

    from serve_app.app import build_app

    prefix = route_prefix or f"/{name}"
    serve.run(build_app(args), name=name, route_prefix=prefix)
    try:
        if engine_replicas:
            wait_until_router_knows(name, engine_replicas, timeout_s=timeout_s)
        yield f"{serve_url}{prefix}"
    finally:
        serve.delete(name)
