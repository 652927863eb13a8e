"""API-key authentication of the HTTP edge, as vLLM's ``--api-key`` (``AuthenticationMiddleware``
in vllm/entrypoints/serve/middleware/authenticate.py): a pure ASGI middleware that answers 401
unless ``Authorization: Bearer <key>`` names one of the configured keys.

Guarded: ``/v1/*`` (vLLM's guarded prefix), ``/tokenize`` and ``/detokenize`` (which vLLM leaves
open, but they run the tokenizer and the chat template for anyone); open: ``/health``,
``/version``, ``/metrics`` and the OpenAPI pages. ``OPTIONS`` (CORS preflight) passes, as in vLLM.
Keys are compared as SHA-256 digests with ``secrets.compare_digest`` against every configured
key, so neither the key nor which key matched leaks through timing.

The keys come from the serving ingress (``keys_of``), read per request: the middleware is added to
the module-level FastAPI app before Serve freezes it, while the config is only known once the
ingress replica is built.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Sequence

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from serve_app.http.protocol.errors import APIError

GUARDED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")
GUARDED_EXACT = ("/v1",)


def key_digests(keys: Sequence[str]) -> tuple[bytes, ...]:
    return tuple(hashlib.sha256(k.encode("utf-8")).digest() for k in keys)


def is_guarded(path: str) -> bool:
    return path in GUARDED_EXACT or path.startswith(GUARDED_PREFIXES)


def is_authorized(headers: Headers, digests: Sequence[bytes]) -> bool:
    value = headers.get("authorization")
    if not value:
        return False
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer":
        return False
    given = hashlib.sha256(token.strip().encode("utf-8")).digest()
    match = False
    for digest in digests:  # no early exit: the time taken does not say which key matched
        match |= secrets.compare_digest(given, digest)
    return match


def unauthorized() -> JSONResponse:
    err = APIError(401, "Unauthorized: a valid API key is required (Authorization: Bearer <key>).")
    return JSONResponse(err.to_response().model_dump(), status_code=401, headers={"WWW-Authenticate": "Bearer"})


class ApiKeyMiddleware:
    """``keys_of()``: the SHA-256 digests of the accepted keys now (empty: no auth)."""

    def __init__(self, app: ASGIApp, keys_of: Callable[[], Sequence[bytes]]) -> None:
        self.app = app
        self.keys_of = keys_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)
            return
        digests = self.keys_of()
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if digests and is_guarded(path) and not is_authorized(Headers(scope=scope), digests):
            await unauthorized()(scope, receive, send)
            return
        await self.app(scope, receive, send)
