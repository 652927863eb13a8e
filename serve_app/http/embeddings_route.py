"""``POST /v1/embeddings`` and ``POST /pooling`` (the same vectors in vLLM's pooling shape:
``protocol.pooling``): parse (``protocol.embeddings``), resolve the model (404), tokenize
each input, then place every input on a pool whose engine serves embeddings (vLLM's pooling
runner: ``RouteRequest.task == "embed"``; a model with none: 404, as vLLM's server has no such
route for a generative model; a pinned pool that cannot: 400 naming ``model``) and gather the
vectors. One engine request per input, counted against ``max_concurrent_requests`` as a
completion's prompts are.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from accel.contract import EmbeddingResult, EmbedRequest, InvalidRequestError
from deployments.config.ingress import IngressConfig
from deployments.messages.routing import RouteRequest
from serve_app.http import limits
from serve_app.http.engine_client import EngineClient
from serve_app.http.json_io import error_response, read_body
from serve_app.http.protocol.common import random_id
from serve_app.http.protocol.embeddings import (
    EmbeddingRequest,
    embedding_prompts,
    embedding_response,
    parse_embedding_request,
)
from serve_app.http.protocol.errors import APIError
from serve_app.http.protocol.pooling import parse_pooling_request, pooling_response
from serve_app.http.tokenize_routes import ModelLookup
from serve_app.http.workers import in_worker

POOL_HEADER = "x-meshserve-pool"


@dataclass(frozen=True)
class PoolingApi:
    """What differs between the endpoints: the parse, the response id's prefix and the render."""

    parse: Callable[[Mapping[str, Any]], EmbeddingRequest]
    id_prefix: str
    render: Callable[[str, int, str, Sequence[EmbeddingResult], EmbeddingRequest], BaseModel]


EMBEDDINGS = PoolingApi(parse_embedding_request, "embd", embedding_response)
POOLING = PoolingApi(parse_pooling_request, "pooling", pooling_response)


async def pooled(
    api: PoolingApi,
    request: Request,
    client: EngineClient,
    lookup: ModelLookup,
    bound: limits.ConcurrencyBound,
    config: IngressConfig,
    on_reject: Callable[[str, int], None],
) -> Response:
    """The endpoint ``api``; ``on_reject(model label, status)`` counts a refused request."""
    held, label = 0, "unknown"
    try:
        body = await read_body(request)
        req = api.parse(body)
        model, tok = lookup(req.model)
        label = model.name
        prompts = await in_worker(embedding_prompts, req, tok, model.max_model_len)
        if not bound.try_acquire(len(prompts)):
            raise APIError(429, "Too many requests in flight; retry later.", None, config.retry_after_s)
        held = len(prompts)
        base_id = random_id(api.id_prefix)
        pool = request.headers.get(POOL_HEADER)
        embeds = [
            EmbedRequest(f"{base_id}-{i}", ids, req.dimensions, req.use_activation) for i, ids in enumerate(prompts)
        ]
        routes = [RouteRequest(e.request_id, model.name, e.num_prompt_tokens, pool, task="embed") for e in embeds]
        client.check_routable(routes[0])
        results = await _all_or_none([client.embed(e, r) for e, r in zip(embeds, routes)])
        response_id = req.request_id or request.headers.get("x-request-id") or base_id
        out = api.render(response_id, int(time.time()), model.name, results, req)
        return JSONResponse(out.model_dump())
    except APIError as err:
        on_reject(label, err.status)
        return error_response(err)
    except InvalidRequestError as err:
        on_reject(label, 400)
        return error_response(APIError(400, err.message, err.field))
    finally:
        if held:
            bound.release(held)


async def _all_or_none(calls: list[Coroutine[Any, Any, EmbeddingResult]]) -> list[EmbeddingResult]:
    """Every call's result in order; the first failure cancels the others and is raised."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
