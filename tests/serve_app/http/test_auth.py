"""API-key auth of the edge (vLLM's --api-key): guarded paths need the bearer key, 401 OpenAI error
otherwise; /health, /version and OPTIONS stay open; no keys = open."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from serve_app.http.auth import ApiKeyMiddleware, is_guarded, key_digests


def _client(keys: list[str]) -> TestClient:
    app = FastAPI()
    digests = key_digests(keys)
    app.add_middleware(ApiKeyMiddleware, keys_of=lambda: digests)

    for path in ("/health", "/version", "/tokenize", "/detokenize"):
        app.add_api_route(path, lambda: {"ok": True}, methods=["GET", "POST"])
    app.add_api_route("/v1/models", lambda: {"ok": True}, methods=["GET", "OPTIONS"])
    app.add_api_route("/v1/completions", lambda: {"ok": True}, methods=["POST"])
    return TestClient(app)


@pytest.mark.parametrize("path", ["/v1/models", "/tokenize", "/detokenize"])
def test_guarded_paths_need_a_key(path):
    client = _client(["k1", "k2"])
    method = client.get if path == "/v1/models" else client.post
    r = method(path)
    assert r.status_code == 401
    err = r.json()["error"]
    assert err["type"] == "AuthenticationError" and err["code"] == 401 and "Unauthorized" in err["message"]
    assert method(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert method(path, headers={"Authorization": "Basic k1"}).status_code == 401
    assert method(path, headers={"Authorization": "Bearer k1"}).status_code == 200
    assert method(path, headers={"authorization": "bearer k2"}).status_code == 200


def test_open_paths_and_preflight():
    client = _client(["k1"])
    assert client.get("/health").status_code == 200
    assert client.get("/version").status_code == 200
    assert client.options("/v1/models").status_code != 401


def test_no_keys_means_open():
    client = _client([])
    assert client.post("/v1/completions").status_code == 200


def test_guard_prefixes():
    assert is_guarded("/v1/chat/completions") and is_guarded("/v1") and is_guarded("/tokenize")
    assert not is_guarded("/v10") and not is_guarded("/health") and not is_guarded("/version")
