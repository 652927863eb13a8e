"""The pooling endpoints: ``POST /v1/embeddings``, ``/pooling`` (the same vectors in vLLM's
pooling shape), ``/score`` and ``/rerank`` (cosine similarity of the texts' embeddings, as vLLM
scores with an embedding model) and Cohere's ``/v2/embed``. Each parses its body into a
``PooledCall`` (the protocol layer: ``protocol.embeddings``, ``protocol.pooling``,
``protocol.scoring``, ``protocol.cohere_embed``); then alike: resolve the
model (404), tokenize its prompts, place every prompt on a pool whose engine serves embeddings
(vLLM's pooling runner: ``RouteRequest.task == "embed"``; a model with none: 404, as vLLM's server
has no such route for a generative model; a pinned pool that cannot: 400 naming ``model``),
gather the vectors and let the call render them. One engine request per prompt, counted against
``max_concurrent_requests`` as a completion's prompts are.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from accel.contract import EmbeddingResult, EmbedRequest, InvalidRequestError
from accel.text.tokenizer import TextTokenizer
from deployments.config.ingress import IngressConfig
from deployments.messages.routing import RouteRequest
from serve_app.http import limits
from serve_app.http.engine_client import EngineClient
from serve_app.http.json_io import error_response, read_body
from serve_app.http.protocol.cohere_embed import parse_cohere_request
from serve_app.http.protocol.embeddings import parse_embedding_request
from serve_app.http.protocol.errors import APIError
from serve_app.http.protocol.pooling import parse_pooling_request
from serve_app.http.protocol.pooling_encoding import BinaryBody
from serve_app.http.protocol.scoring import parse_rerank_request, parse_score_request
from serve_app.http.tokenize_routes import ModelLookup
from serve_app.http.workers import in_worker

POOL_HEADER = "x-meshserve-pool"
# The body fields that carry text to tokenize, across the pooling endpoints (and Cohere's).
TEXT_FIELDS = (
    "input",
    "messages",
    "query",
    "queries",
    "documents",
    "items",
    "data_1",
    "data_2",
    "text_1",
    "text_2",
    "texts",
    "inputs",
)

logger = logging.getLogger(__name__)
# A call's answer: a body model, vLLM's binary body, or a JSON body already dumped (Cohere's
# leaves out its None fields).
Rendered = BaseModel | BinaryBody | dict[str, Any]


class PooledCall(Protocol):
    """A parsed pooling request: its prompts, its engine options, and its render."""

    @property
    def model(self) -> str | None: ...

    @property
    def request_id(self) -> str | None: ...

    @property
    def use_activation(self) -> bool | None: ...

    @property
    def dimensions(self) -> int | None: ...

    def prompts(self, tok: TextTokenizer, max_model_len: int) -> list[tuple[int, ...]]: ...

    def render(self, response_id: str, created: int, model: str, results: Sequence[EmbeddingResult]) -> Rendered: ...


@dataclass(frozen=True)
class PoolingApi:
    """One endpoint: its parse and its response id's prefix (vLLM's: ``<prefix>-<request id>``)."""

    parse: Callable[[Mapping[str, Any]], PooledCall]
    id_prefix: str


EMBEDDINGS = PoolingApi(parse_embedding_request, "embd")
POOLING = PoolingApi(parse_pooling_request, "pooling")
SCORE = PoolingApi(parse_score_request, "score")
RERANK = PoolingApi(parse_rerank_request, "score")
COHERE_EMBED = PoolingApi(parse_cohere_request, "embd")


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
        limits.check_unicode(body)
        limits.check_chat_template(body, config)
        call = api.parse(body)
        model, tok = lookup(call.model)
        label = model.name
        _check_text_size(body, config.prompt_char_cap(model.max_model_len))
        prompts = await in_worker(call.prompts, tok, model.max_model_len)
        if not bound.try_acquire(len(prompts)):
            raise APIError(429, "Too many requests in flight; retry later.", None, config.retry_after_s)
        held = len(prompts)
        # As vLLM: the X-Request-Id header, else the body's request_id, else a new one.
        base_id = request.headers.get("x-request-id") or call.request_id or uuid.uuid4().hex
        response_id = f"{api.id_prefix}-{base_id}"
        engine_id = f"{api.id_prefix}-{uuid.uuid4().hex}"  # unique even when clients reuse ids
        results = await _embed_all(client, model.name, prompts, call, engine_id, request.headers.get(POOL_HEADER))
        return _response(call.render(response_id, int(time.time()), model.name, results))
    except APIError as err:
        on_reject(label, err.status)
        return error_response(err)
    except InvalidRequestError as err:
        on_reject(label, 400)
        return error_response(APIError(400, err.message, err.field))
    except Exception:
        logger.exception("pooling request failed")  # details in the log only, as the other endpoints
        on_reject(label, 500)
        return error_response(APIError(500, "Internal server error; see the server log."))
    finally:
        if held:
            bound.release(held)


def _response(rendered: Rendered) -> Response:
    if isinstance(rendered, BinaryBody):  # vLLM's bytes / bytes_only answer
        return Response(rendered.content, headers=rendered.headers, media_type=rendered.media_type)
    return JSONResponse(rendered if isinstance(rendered, dict) else rendered.model_dump())


def _check_text_size(body: Mapping[str, Any], cap: int) -> None:
    """400 past the ingress's character cap (``max_prompt_chars``), before anything is tokenized
    (every string of the field: a conversation's too)."""
    for field in TEXT_FIELDS:
        chars = limits.prompt_chars({"prompt": body.get(field)}, is_chat=False)
        if chars > cap:
            raise APIError(
                400, f"{field} has {chars} characters, more than the limit of {cap}; please reduce the input.", field
            )


async def _embed_all(
    client: EngineClient,
    model: str,
    prompts: Sequence[tuple[int, ...]],
    call: PooledCall,
    engine_id: str,
    pool: str | None,
) -> list[EmbeddingResult]:
    """Every prompt's vector, in order (one engine request each, task ``embed``)."""
    embeds = [
        EmbedRequest(f"{engine_id}-{i}", ids, call.dimensions, call.use_activation) for i, ids in enumerate(prompts)
    ]
    routes = [RouteRequest(e.request_id, model, e.num_prompt_tokens, pool, task="embed") for e in embeds]
    client.check_routable(routes[0])
    return await _all_or_none([client.embed(e, r) for e, r in zip(embeds, routes)])


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
