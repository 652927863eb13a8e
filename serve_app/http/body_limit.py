"""The request-body bound of the HTTP edge (``ingress.max_request_bytes``): a pure ASGI middleware
that answers 413 as soon as a body is known to be too large — from ``Content-Length`` before any
of it is read, else (chunked uploads) once the bytes read pass the bound — so a huge body costs
the ingress at most ``max_request_bytes`` of memory and never reaches the JSON parser.

The body is read here (bounded) and handed on whole: the endpoints read all of it anyway.
The bound comes from the serving ingress per request (``limit_of``), as for ``auth.py``.

A refusal is sent whole at once, but the response is completed only after the rest of the upload
is read and discarded (at most ``LINGER_S``, giving up after ``LINGER_IDLE_S`` without a byte),
as nginx's lingering close does: closing a socket with unread bytes makes the kernel answer with
a reset, which discards the 413 on the client before it reads it (and uvicorn stops handing the
body to the app once the response is complete, so the drain must come before).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.http.protocol.errors import APIError

LINGER_S = 30.0  # the longest a refused upload is drained (nginx's lingering_time)
LINGER_IDLE_S = 5.0  # stop draining after this long without a byte (nginx's lingering_timeout)


def too_large(limit: int) -> JSONResponse:
    err = APIError(413, f"The request body is larger than the limit of {limit} bytes.")
    return JSONResponse(err.to_response().model_dump(), status_code=413, headers={"Connection": "close"})


async def _refuse(limit: int, receive: Receive, send: Send, body_left: bool) -> None:
    """Send the 413 whole, drain what is left of the upload (``body_left``), then complete it."""
    response = too_large(limit)
    await send({"type": "http.response.start", "status": 413, "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": True})
    if body_left:
        await _drain(receive)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _drain(receive: Receive) -> None:
    """Read and discard request messages until the body ends, the client leaves, or time is up."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LINGER_S
    while (left := deadline - loop.time()) > 0:
        try:
            message = await asyncio.wait_for(receive(), timeout=min(left, LINGER_IDLE_S))
        except asyncio.TimeoutError:
            return
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


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
            await _refuse(limit, receive, send, body_left=True)
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
                await _refuse(limit, receive, send, body_left=message.get("more_body", False))
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
