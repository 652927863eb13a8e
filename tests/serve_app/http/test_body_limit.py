"""The body bound answers 413 before reading a declared-too-large body, and once a chunked body
passes the bound; bodies under it reach the endpoint whole."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from serve_app.http.body_limit import BodyLimitMiddleware

LIMIT = 1000


def _app() -> FastAPI:
    app = FastAPI()
    app.add_middleware(BodyLimitMiddleware, limit_of=lambda: LIMIT)

    @app.post("/echo")
    async def echo(request: Request) -> dict:
        return {"size": len(await request.body())}

    return app


def test_under_the_limit_passes_whole():
    r = TestClient(_app()).post("/echo", content=b"x" * LIMIT)
    assert r.status_code == 200 and r.json() == {"size": LIMIT}


def test_declared_length_over_the_limit_is_413_unread():
    received: list[int] = []
    sent: list[dict] = []
    more = [{"type": "http.request", "body": b"x" * 500, "more_body": True}] * 10

    async def receive():
        received.append(1)
        return more.pop(0)

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/echo",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-length", str(5000).encode())],
    }
    asyncio.run(_app()(scope, receive, send))
    assert sent[0]["status"] == 413 and not received  # not one byte read
    assert b"RequestEntityTooLarge" in sent[1]["body"] and b"1000 bytes" in sent[1]["body"]


def test_chunked_body_over_the_limit_is_413():
    def chunks():
        for _ in range(5):
            yield b"x" * 400

    r = TestClient(_app()).post("/echo", content=chunks())
    assert r.status_code == 413 and r.json()["error"]["code"] == 413
