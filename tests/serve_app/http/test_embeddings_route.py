"""``POST /v1/embeddings`` over the ingress's ``EngineClient`` with doubles of Serve's handles: one
engine request per input on the pool the router picks (task ``embed``), tickets released, the
body in vLLM's shape; refusals with vLLM's statuses."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import numpy as np
import pytest
from starlette.requests import Request

from accel.contract import EmbeddingResult, InvalidRequestError
from deployments.config.ingress import IngressConfig
from deployments.config.router import RouterConfig
from deployments.messages.routing import RouteDecision
from serve_app.http import limits
from serve_app.http.embeddings_route import EMBEDDINGS, POOLING, pooled
from serve_app.http.engine_client import EngineClient
from serve_app.http.tokenize_routes import model_lookup
from tests.doubles.app_configs import app_config, pool_config
from tests.serve_app.http.engine_doubles import FakeMethod, FakeResponse, FakeRouterHandle


def _embed_pool(name, model):
    pool = pool_config(name, model, "vllm")
    return dataclasses.replace(
        pool, engine_config=dataclasses.replace(pool.engine_config, extra_args={"runner": "pooling"})
    )


class FakeEmbedHandle:
    """A pool handle whose ``embed.remote`` answers a vector made from the prompt (or ``error``)."""

    def __init__(self, error=None):
        self.calls = []

        def embed(request, replica_hint=None):
            self.calls.append((request.request_id, request.prompt_token_ids, replica_hint))
            vector = tuple(float(t) for t in request.prompt_token_ids[:2])
            return FakeResponse(EmbeddingResult(request.request_id, vector, request.num_prompt_tokens), error=error)

        self.embed = FakeMethod(embed)


def _setup(tiny_llama, error=None, max_concurrent=8):
    from accel.text.tokenizer import load_tokenizer

    pools = (_embed_pool("emb", "e"), pool_config("gen", "g", "vllm"))
    config = app_config(pools, RouterConfig(decision_timeout_s=1), ingress=IngressConfig(retry_after_s=2))
    router = FakeRouterHandle(RouteDecision("emb", "replica-1", "ticket", "test"))
    handle = FakeEmbedHandle(error)
    client = EngineClient(config, router, {"emb": handle, "gen": FakeEmbedHandle()})
    tok = load_tokenizer(str(tiny_llama))
    lookup = model_lookup({m.name: m for m in config.models}, {"e": tok, "g": tok})
    rejects: list[tuple[str, int]] = []
    bound = limits.ConcurrencyBound(max_concurrent)

    def call(body, headers=(), api=EMBEDDINGS):
        payload = json.dumps(body).encode()

        async def receive():
            return {"type": "http.request", "body": payload, "more_body": False}

        scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": list(headers)}
        response = asyncio.run(
            pooled(
                api, Request(scope, receive), client, lookup, bound, config.ingress, lambda m, s: rejects.append((m, s))
            )
        )
        if response.media_type == "application/octet-stream":
            return response.status_code, response
        return response.status_code, json.loads(response.body)

    return call, router, handle, rejects, tok, bound


def test_each_input_is_one_engine_request_and_tickets_are_released(tiny_llama):
    call, router, handle, rejects, tok, bound = _setup(tiny_llama)
    status, body = call({"model": "e", "input": ["hello world", "x"]})
    assert status == 200, body
    ids = [tuple(tok.encode("hello world")), tuple(tok.encode("x"))]
    assert [c[1] for c in handle.calls] == ids and {c[2] for c in handle.calls} == {"replica-1"}
    assert [r.task for r in router.routes] == ["embed", "embed"]
    assert router.released == ["ticket", "ticket"] and bound.held == 0
    assert [d["embedding"] for d in body["data"]] == [[float(t) for t in i[:2]] for i in ids]
    assert [d["index"] for d in body["data"]] == [0, 1] and body["model"] == "e" and body["id"].startswith("embd-")
    n = sum(map(len, ids))
    assert body["usage"] == {
        "prompt_tokens": n,
        "total_tokens": n,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    assert rejects == []


def test_request_id_is_the_response_id(tiny_llama):
    call, *_ = _setup(tiny_llama)
    assert call({"model": "e", "input": [5, 6], "request_id": "mine"})[1]["id"] == "embd-mine"  # as vLLM
    headers = [(b"x-request-id", b"theirs")]
    assert call({"model": "e", "input": [5, 6], "request_id": "mine"}, headers)[1]["id"] == "embd-theirs"


def test_refusals_have_vllms_statuses(tiny_llama):
    call, router, handle, rejects, *_ = _setup(tiny_llama)
    assert call({"model": "g", "input": "x"})[0] == 404  # a generative model has no /v1/embeddings
    assert call({"model": "nope", "input": "x"})[0] == 404
    status, body = call({"model": "e", "input": "x"}, [(b"x-meshserve-pool", b"gen")])
    assert (status, body["error"]["param"]) == (400, "x-meshserve-pool")  # a pool of another model
    assert call({"model": "e", "input": "x", "embed_dtype": "float64"})[0] == 400
    assert handle.calls == [] and router.routes == []
    # (labelled with the served model once resolved; a body refused before that: "unknown")
    assert rejects == [("g", 404), ("unknown", 404), ("e", 400), ("unknown", 400)]


@pytest.mark.parametrize("error", [InvalidRequestError("dimensions", "not Matryoshka"), RuntimeError("boom")])
def test_engine_failures(tiny_llama, error):
    call, router, *_ = _setup(tiny_llama, error=error)
    status, body = call({"model": "e", "input": "x", "dimensions": 8})
    if isinstance(error, InvalidRequestError):
        assert (status, body["error"]["param"]) == (400, "dimensions")
    else:
        assert status == 500 and "boom" not in body["error"]["message"]
    assert router.released == ["ticket"]


def test_over_the_concurrency_bound_is_429(tiny_llama):
    call, *_ = _setup(tiny_llama, max_concurrent=1)
    status, body = call({"model": "e", "input": ["a", "b"]})
    assert status == 429


def test_pooling_is_the_same_vectors_in_vllms_pooling_shape(tiny_llama):
    call, router, handle, rejects, tok, bound = _setup(tiny_llama)
    status, body = call({"model": "e", "input": ["hello world", "x"], "task": "embed"}, api=POOLING)
    assert status == 200, body
    ids = [tuple(tok.encode("hello world")), tuple(tok.encode("x"))]
    assert [(d["index"], d["object"], d["data"]) for d in body["data"]] == [
        (i, "pooling", [float(t) for t in p[:2]]) for i, p in enumerate(ids)
    ]
    assert body["id"].startswith("pooling-") and body["usage"]["prompt_tokens"] == sum(map(len, ids))
    status, body = call({"model": "e", "input": "x", "task": "token_embed"}, api=POOLING)
    assert (status, body["error"]["param"]) == (400, "task")
    assert call({"model": "g", "input": "x"}, api=POOLING)[0] == 404


def test_score_and_rerank_embed_each_text_once(tiny_llama):
    from serve_app.http.embeddings_route import RERANK, SCORE

    call, router, handle, rejects, tok, bound = _setup(tiny_llama)
    status, body = call(
        {"model": "e", "queries": "hello", "documents": ["hello world", "x"], "request_id": "q"}, api=SCORE
    )
    assert status == 200, body
    texts = ["hello", "hello world", "x"]
    assert [c[1] for c in handle.calls] == [tuple(tok.encode(t)) for t in texts]
    assert body["id"] == "score-q" and [d["index"] for d in body["data"]] == [0, 1]
    assert body["usage"]["prompt_tokens"] == sum(len(tok.encode(t)) for t in texts)
    status, body = call({"model": "e", "query": "hello", "documents": ["hello world", "x"], "top_n": 1}, api=RERANK)
    assert status == 200 and len(body["results"]) == 1 and router.released == ["ticket"] * 6
    assert call({"model": "g", "queries": "a", "documents": "b"}, api=SCORE)[0] == 404


def test_invalid_unicode_and_oversized_text_are_400_before_tokenizing(tiny_llama):
    call, router, handle, *_ = _setup(tiny_llama)
    status, body = call({"model": "e", "input": ["ok", "bad \ud800"]})
    assert (status, body["error"]["param"]) == (400, "input")
    status, body = call({"model": "e", "input": "x" * (2048 * 32 + 1)})  # past max_model_len x 32 characters
    assert (status, body["error"]["param"]) == (400, "input")
    from serve_app.http.embeddings_route import RERANK

    status, body = call({"model": "e", "query": "q", "documents": ["y" * (2048 * 32 + 1)]}, api=RERANK)
    assert (status, body["error"]["param"]) == (400, "documents")
    assert handle.calls == []


def test_bytes_are_vllms_binary_body(tiny_llama):
    call, router, handle, rejects, tok, bound = _setup(tiny_llama)
    status, response = call({"model": "e", "input": [[5, 6], [7, 8, 9]], "encoding_format": "bytes", "request_id": "b"})
    assert status == 200
    meta = json.loads(response.headers["metadata"])
    assert meta["id"] == "embd-b" and meta["model"] == "e" and meta["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    assert [(d["index"], d["start"], d["end"], d["shape"]) for d in meta["data"]] == [(0, 0, 8, [2]), (1, 8, 16, [2])]
    assert response.body == np.asarray([5, 6, 7, 8], dtype=np.float32).tobytes()
    status, response = call({"model": "e", "input": [5, 6], "encoding_format": "bytes_only"}, api=POOLING)
    assert status == 200 and "metadata" not in response.headers and len(response.body) == 8


def test_the_chat_form_is_rendered_then_embedded(tiny_llama):
    call, router, handle, rejects, tok, bound = _setup(tiny_llama)
    conversation = [{"role": "user", "content": "hello"}]
    expected = tuple(tok.apply_chat_template(conversation, add_generation_prompt=False))
    status, body = call({"model": "e", "messages": [conversation, conversation]})
    assert status == 200, body
    assert [c[1] for c in handle.calls] == [expected, expected] and len(body["data"]) == 2
    status, body = call({"model": "e", "messages": conversation, "task": "embed"}, api=POOLING)
    assert status == 200 and body["data"][0]["object"] == "pooling" and handle.calls[-1][1] == expected
    status, body = call({"model": "e", "messages": conversation, "chat_template": "{{ 'x' }}"})
    assert (status, body["error"]["param"]) == (400, "chat_template")  # untrusted, as vLLM's default
