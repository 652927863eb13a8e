"""vLLM's ``/pooling`` for an embedding model (``vllm/entrypoints/pooling/pooling/protocol.py``):
the embeddings request plus ``task``, answered with the same vectors in vLLM's pooling shape
(``object: "pooling"``, the vector under ``data``; ``bytes`` / ``bytes_only`` as for embeddings),
its chat form one conversation in ``messages`` (vLLM's ``PoolingChatRequest``). A model served
by our pooling pools runs the ``embed`` task only: any other ``task`` is a 400 naming it, as
vLLM refuses a task its model's pooler is not configured for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from accel.contract import EmbeddingResult
from serve_app.http.protocol.common import OpenAIBaseModel, UsageInfo
from serve_app.http.protocol.embeddings import (
    EmbeddingChatRequest,
    EmbeddingRequest,
    encode_embedding,
    parse_embedding_request,
)
from serve_app.http.protocol.errors import bad_request
from serve_app.http.protocol.pooling_encoding import BYTES_FORMATS, BinaryBody, binary_body

SERVED_TASK = "embed"


class PoolingRequest(EmbeddingRequest):
    task: str | None = None

    def render(
        self, response_id: str, created: int, model: str, results: Sequence[EmbeddingResult]
    ) -> BaseModel | BinaryBody:
        return pooling_response(response_id, created, model, results, self)


class PoolingChatRequest(EmbeddingChatRequest):
    task: str | None = None

    def render(
        self, response_id: str, created: int, model: str, results: Sequence[EmbeddingResult]
    ) -> BaseModel | BinaryBody:
        return pooling_response(response_id, created, model, results, self)


class PoolingResponseData(OpenAIBaseModel):
    index: int
    object: str = "pooling"
    data: list[float] | str


class PoolingResponse(OpenAIBaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[PoolingResponseData]
    usage: UsageInfo


def parse_pooling_request(body: Mapping[str, Any]) -> PoolingRequest | PoolingChatRequest:
    """The body as an embeddings request; a ``task`` other than ``embed`` is a 400 naming it."""
    task = body.get("task")
    if task is not None and task != SERVED_TASK:
        raise bad_request(f"Unsupported task: {task!r} Supported tasks: [{SERVED_TASK!r}]", "task")
    req = parse_embedding_request({k: v for k, v in body.items() if k != "task"}, api="pooling")
    cls = PoolingChatRequest if isinstance(req, EmbeddingChatRequest) else PoolingRequest
    return cls.model_validate({**req.model_dump(), "task": task})


def pooling_response(
    request_id: str, created: int, model: str, results: Sequence[EmbeddingResult], req: EmbeddingRequest
) -> PoolingResponse | BinaryBody:
    if req.encoding_format in BYTES_FORMATS:
        return binary_body(request_id, created, model, results, req.encoding_format, req.embed_dtype, req.endianness)
    num_tokens = sum(r.num_prompt_tokens for r in results)
    data = [PoolingResponseData(index=i, data=encode_embedding(r.embedding, req)) for i, r in enumerate(results)]
    usage = UsageInfo(prompt_tokens=num_tokens, total_tokens=num_tokens, completion_tokens=0)
    return PoolingResponse(id=request_id, created=created, model=model, data=data, usage=usage)
