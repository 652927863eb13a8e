"""``POST /invocations``: the endpoint vLLM 0.32's SageMaker router picks for a body (its request
types, in its order, among the model's tasks), and the dispatch to our route for it."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.responses import JSONResponse
from starlette.requests import Request

from serve_app.http.invocations import choose, invoke
from serve_app.http.protocol.errors import APIError

GENERATE, EMBED = frozenset({"generate"}), frozenset({"embed"})
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.mark.parametrize(
    ("body", "tasks", "endpoint"),
    [
        (CHAT, GENERATE, "chat"),
        ({"model": "m", "prompt": "hi", "max_tokens": 2}, GENERATE, "completions"),
        ({"model": "m", "input": "hi"}, EMBED, "embeddings"),
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, EMBED, "embeddings"),
        ({"model": "m", "input": [{"role": "user", "content": "hi"}]}, EMBED, "embeddings"),
        ({"model": "m", "query": "q", "documents": ["a", "b"]}, EMBED, "rerank"),
        ({"model": "m", "queries": "q", "documents": ["a", "b"]}, EMBED, "score"),
        ({"model": "m", "text_1": "q", "text_2": ["a"]}, EMBED, "score"),
        ({"model": "m", "data": {"x": 1}}, EMBED, "pooling"),
        (CHAT, GENERATE | EMBED, "chat"),
        ({"model": "m", "input": "hi"}, GENERATE | EMBED, "embeddings"),
    ],
)
def test_vllms_order_among_the_models_tasks(body, tasks, endpoint):
    assert choose(body, tasks) == endpoint


@pytest.mark.parametrize(
    ("body", "tasks", "tried"),
    [
        ({"model": "m", "prompt": {"a": 1}}, GENERATE, ["ChatCompletionRequest", "CompletionRequest"]),
        (
            {"model": "m", "messages": "not a list"},
            EMBED,
            [
                "typing.Annotated[vllm.entrypoints.pooling.embed",
                "RerankRequest",
                "ScoreDataRequest",
                "pooling.protocol",
            ],
        ),
        ({"model": "m"}, frozenset(), []),
    ],
)
def test_a_body_no_endpoint_takes_is_vllms_400(body, tasks, tried):
    with pytest.raises(APIError) as err:
        choose(body, tasks)
    assert err.value.status == 400 and err.value.message.startswith("Cannot find suitable handler for request.")
    listed = err.value.message.split("Expected one of: ", 1)[1]
    positions = [listed.find(name) for name in tried]
    assert -1 not in positions and positions == sorted(positions)


def test_a_request_types_own_check_is_its_400():
    """vLLM's ``CompletionRequest`` raises its own error for a body without a prompt (not a
    validation error: vLLM's loop does not go on), so a generative model answers that 400; a
    model serving embeddings too goes on to them."""
    with pytest.raises(APIError) as err:
        choose({"model": "m", "input": "hi"}, GENERATE)
    assert err.value.status == 400 and "prompt" in err.value.message
    assert choose({"model": "m", "input": "hi"}, GENERATE | EMBED) == "embeddings"


def _request(body) -> Request:
    payload = json.dumps(body).encode()

    async def receive():
        return {"type": "http.request", "body": payload, "more_body": False}

    return Request({"type": "http", "method": "POST", "path": "/invocations", "headers": []}, receive)


def test_invoke_hands_the_request_with_its_body_to_the_chosen_route():
    seen, rejects = [], []

    def handler(name):
        async def route(request):
            seen.append((name, await request.json()))  # the body read again: cached on the request
            return JSONResponse({"served_by": name})

        return route

    handlers = {n: handler(n) for n in ("chat", "completions", "embeddings", "rerank", "score", "pooling")}
    tasks_of = {"gen": GENERATE, "emb": EMBED}.get

    def call(body):
        return asyncio.run(
            invoke(_request(body), lambda m: tasks_of(m, GENERATE | EMBED), handlers, lambda *a: rejects.append(a))
        )

    assert json.loads(call({"model": "emb", "input": "x"}).body) == {"served_by": "embeddings"}
    assert json.loads(call(CHAT | {"model": "gen"}).body) == {"served_by": "chat"}
    assert seen == [("embeddings", {"model": "emb", "input": "x"}), ("chat", CHAT | {"model": "gen"})]
    refused = call({"model": "gen", "input": "x"})
    assert refused.status_code == 400 and rejects == [("unknown", 400)]
    assert "prompt" in json.loads(refused.body)["error"]["message"]  # CompletionRequest's own check
