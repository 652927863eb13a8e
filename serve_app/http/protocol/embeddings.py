"""``/v1/embeddings`` as vLLM 0.32 serves it (``vllm/entrypoints/pooling/embed/protocol.py``):
the request model, its parse into token-id prompts, and the response body.

Honoured: ``input`` (a string, a list of strings, a list of token ids, a list of lists of token
ids), ``encoding_format`` ``float`` / ``base64`` (little- or big-endian ``float32`` or
``float16``: ``embed_dtype``, ``endianness``), ``dimensions`` (vLLM's engine refuses it on a
model that is not Matryoshka), ``use_activation``, ``add_special_tokens``,
``truncate_prompt_tokens`` / ``truncation_side`` (a pooling model's default side is vLLM's,
"right": the first tokens are kept), ``request_id``, ``user``. Refused with a 400 naming the
field: the chat forms (``messages``, a conversation in ``input``), the byte encodings, other
dtypes, ``padding``, ``mm_processor_kwargs``, ``cache_salt``, ``priority`` other than 0 and
vLLM's removed ``normalize``.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from accel.contract import EmbeddingResult
from accel.text.tokenizer import TextTokenizer
from serve_app.http.protocol.common import OpenAIBaseModel, UsageInfo
from serve_app.http.protocol.errors import bad_request
from serve_app.http.protocol.truncation import truncation

POOLING_TRUNCATION_SIDE = "right"  # vllm.tokenizers.registry.get_tokenizer, runner_type "pooling"
REFUSED_FIELDS = ("messages", "padding", "mm_processor_kwargs", "cache_salt", "normalize", "chat_template")
_DTYPES: Mapping[str, str] = {"float32": "f4", "float16": "f2"}


class EmbeddingRequest(OpenAIBaseModel):
    model: str | None = None
    input: list[int] | list[list[int]] | str | list[str]
    encoding_format: Literal["float", "base64", "bytes", "bytes_only"] = "float"
    dimensions: int | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    request_id: str | None = None
    priority: int = 0
    add_special_tokens: bool = True
    embed_dtype: str = "float32"
    endianness: Literal["native", "little", "big"] = "native"
    use_activation: bool | None = None

    def prompts(self, tok: TextTokenizer, max_model_len: int) -> list[tuple[int, ...]]:
        """The prompts to embed, one per input."""
        return embedding_prompts(self, tok, max_model_len)

    def render(self, response_id: str, created: int, model: str, results: Sequence[EmbeddingResult]) -> BaseModel:
        return embedding_response(response_id, created, model, results, self)


class EmbeddingResponseData(OpenAIBaseModel):
    index: int
    object: str = "embedding"
    embedding: list[float] | str


class EmbeddingResponse(OpenAIBaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[EmbeddingResponseData]
    usage: UsageInfo


def parse_embedding_request(body: Mapping[str, Any]) -> EmbeddingRequest:
    """The body as an ``EmbeddingRequest``; a refused or invalid field is a 400 naming it."""
    for name in REFUSED_FIELDS:
        if body.get(name) is not None:
            raise bad_request(f"`{name}` is not supported by this server's /v1/embeddings", name)
    if isinstance(body.get("input"), list) and any(isinstance(x, dict) for x in body["input"]):
        raise bad_request("chat conversations in `input` are not supported by this server", "input")
    try:
        req = EmbeddingRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else None
        raise bad_request(f"{field}: {first['msg']}", field) from None
    if req.encoding_format not in ("float", "base64"):
        raise bad_request(f"encoding_format {req.encoding_format!r} is not supported here", "encoding_format")
    if req.embed_dtype not in _DTYPES:
        raise bad_request(f"embed_dtype {req.embed_dtype!r} is not supported here: {list(_DTYPES)}", "embed_dtype")
    if req.priority != 0:
        raise bad_request("priority scheduling is not enabled on this server", "priority")
    return req


def embedding_prompts(req: EmbeddingRequest, tok: TextTokenizer, max_model_len: int) -> list[tuple[int, ...]]:
    """Each input as token ids (texts tokenized with ``add_special_tokens``), truncated as asked."""
    items: Sequence[Any] = [req.input] if isinstance(req.input, str) or _is_ids(req.input) else req.input
    if not items:
        raise bad_request("You must pass at least one prompt", "input")
    cut = truncation(req.truncate_prompt_tokens, req.truncation_side or POOLING_TRUNCATION_SIDE, 0, max_model_len)
    prompts = []
    for item in items:
        ids = tuple(tok.encode(item, add_special_tokens=req.add_special_tokens)) if isinstance(item, str) else item
        ids = tuple(ids) if cut is None else cut.apply(tuple(ids))
        if not ids:
            raise bad_request("an input is empty", "input")
        if len(ids) > max_model_len:
            raise bad_request(
                f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"{len(ids)} tokens in the input for embedding generation. Please reduce the length of the input.",
                "input",
            )
        prompts.append(ids)
    return prompts


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(x, int) for x in value)


def encode_embedding(values: Sequence[float], req: EmbeddingRequest) -> list[float] | str:
    """One vector as the request asks: floats, or base64 of its bytes (vLLM's ``tensor2binary``)."""
    if req.encoding_format == "float":
        return list(values)
    order = {"native": "=", "little": "<", "big": ">"}[req.endianness]
    array = np.asarray(values, dtype=np.float32).astype(np.dtype(order + _DTYPES[req.embed_dtype]))
    return base64.b64encode(array.tobytes()).decode("ascii")


def embedding_response(
    request_id: str, created: int, model: str, results: Sequence[EmbeddingResult], req: EmbeddingRequest
) -> EmbeddingResponse:
    num_tokens = sum(r.num_prompt_tokens for r in results)
    data = [EmbeddingResponseData(index=i, embedding=encode_embedding(r.embedding, req)) for i, r in enumerate(results)]
    usage = UsageInfo(prompt_tokens=num_tokens, total_tokens=num_tokens, completion_tokens=0)
    return EmbeddingResponse(id=request_id, created=created, model=model, data=data, usage=usage)
