"""The body bound answers 413 before reading a declared-too-large body, and once a chunked body
passes the bound; bodies under it reach the endpoint whole; a client sending a large body over a
real socket reads the 413 (the rest of its upload is drained, not reset)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
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


def test_declared_length_over_the_limit_is_413_before_reading():
    events: list[str] = []  # "read" per body message read, "sent" per message sent
    sent: list[dict] = []
    more = [{"type": "http.request", "body": b"x" * 500, "more_body": i < 9} for i in range(10)]

    async def receive():
        events.append("read")
        return more.pop(0)

    async def send(message):
        events.append("sent")
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
    assert sent[0]["status"] == 413 and events[:2] == ["sent", "sent"]  # answered before one byte read
    assert b"RequestEntityTooLarge" in sent[1]["body"] and b"1000 bytes" in sent[1]["body"]
    assert not more and sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}  # drained


def test_chunked_body_over_the_limit_is_413():
    def chunks():
        for _ in range(5):
            yield b"x" * 400

    r = TestClient(_app()).post("/echo", content=chunks())
    assert r.status_code == 413 and r.json()["error"]["code"] == 413


@pytest.fixture
def server_url() -> Iterator[str]:
    server = uvicorn.Server(uvicorn.Config(_app(), host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _post_then_read(url: str, num_mb: int, declared: bool) -> tuple[int, dict]:
    """A client that writes its whole body before reading (as plain HTTP/1.1 clients do): it sees
    the answer only if the server reads the upload instead of resetting the connection."""
    host, port = url.removeprefix("http://").split(":")
    chunk = b"x" * (1 << 20)
    framing = f"Content-Length: {num_mb * len(chunk)}" if declared else "Transfer-Encoding: chunked"
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(f"POST /echo HTTP/1.1\r\nHost: {host}\r\n{framing}\r\n\r\n".encode())
        for _ in range(num_mb):
            sock.sendall(chunk if declared else b"%x\r\n%s\r\n" % (len(chunk), chunk))
        if not declared:
            sock.sendall(b"0\r\n\r\n")
        answer = b"".join(iter(lambda: sock.recv(1 << 16), b""))
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


@pytest.mark.parametrize("declared", [True, False], ids=["content_length", "chunked"])
def test_a_large_upload_over_a_socket_reads_the_413(server_url, declared):
    """80 MB against a 1000-byte bound: closing with the upload unread reset the connection and the
    client never read the answer; drained, the client reads the 413 and its error."""
    status, body = _post_then_read(server_url, 80, declared)
    assert status == 413 and body["error"]["code"] == 413 and "1000 bytes" in body["error"]["message"]
