"""The request-body bound of the HTTP edge (``ingress.max_request_bytes``): a pure ASGI middleware
that answers 413 as soon as a body is known to be too large — from ``Content-Length`` before any
of it is read, else (chunked uploads) once the bytes read pass the bound — so a huge body costs
the ingress at most ``max_request_bytes`` of memory and never reaches the JSON parser.

The body is read here (bounded) and handed on whole: the endpoints read all of it anyway.
The bound comes from the serving ingress per request (``limit_of``), as for ``auth.py``.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.http.protocol.errors import APIError


def too_large(limit: int) -> JSONResponse:
    err = APIError(413, f"The request body is larger than the limit of {limit} bytes.")
    return JSONResponse(err.to_response().model_dump(), status_code=413, headers={"Connection": "close"})


class BodyLimitMiddleware:
    """``limit_of()``: the largest body in bytes now (None: no bound)."""

    def __init__(self, app: ASGIApp, limit_of: Callable[[], int | None]) -> None:
        self.app = app
        self.limit_of = limit_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.limit_of() if scope["type"] == "http" else None
        if limit is None or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await too_large(limit)(scope, receive, send)
            return
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                messages.append(message)
                break
            size += len(message.get("body", b""))
            if size > limit:
                await too_large(limit)(scope, receive, send)
                return
            messages.append(message)
            if not message.get("more_body", False):
                break
        if len(messages) > 1 and all(m["type"] == "http.request" for m in messages):
            body = b"".join(m.get("body", b"") for m in messages)
            messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)
