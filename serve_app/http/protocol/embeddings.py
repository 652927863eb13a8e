"""``/v1/embeddings`` as vLLM 0.32 serves it (``vllm/entrypoints/pooling/embed/protocol.py``):
the request model, its parse into token-id prompts, and the response body.

Honoured: ``input`` (a string, a list of strings, a list of token ids, a list of lists of token
ids), the chat forms (``messages``: one conversation or a batch of them, or the same in
``input``; rendered with the model's chat template as vLLM renders them, with
``add_generation_prompt``, ``continue_final_message``, ``add_special_tokens`` (default false
there), ``chat_template`` (only with ``trust_request_chat_template``) and
``chat_template_kwargs``), ``encoding_format`` ``float`` / ``base64`` / ``bytes`` /
``bytes_only`` in every ``embed_dtype`` and ``endianness`` vLLM has (``pooling_encoding``),
``dimensions`` (vLLM's engine refuses it on a model that is not Matryoshka), ``use_activation``,
``add_special_tokens``, ``truncate_prompt_tokens`` / ``truncation_side`` (a pooling model's
default side is vLLM's, "right": the first tokens are kept), ``request_id``, ``user``. Refused
with a 400 naming the field: ``padding``, ``mm_processor_kwargs``, ``media_io_kwargs`` and
non-text message parts (no multimodal pooling here), ``cache_salt``, ``priority`` other than 0
and vLLM's removed ``normalize``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from accel.contract import EmbeddingResult
from accel.text.tokenizer import TextTokenizer
from serve_app.http.protocol.common import OpenAIBaseModel, UsageInfo
from serve_app.http.protocol.conversion import render_chat
from serve_app.http.protocol.errors import bad_request
from serve_app.http.protocol.pooling_encoding import (
    BYTES_FORMATS,
    BinaryBody,
    binary_body,
    embed_dtypes,
    encode_vector,
)
from serve_app.http.protocol.truncation import Truncation, truncation

POOLING_TRUNCATION_SIDE = "right"  # vllm.tokenizers.registry.get_tokenizer, runner_type "pooling"
REFUSED_FIELDS = ("padding", "mm_processor_kwargs", "media_io_kwargs", "cache_salt")
# The chat form's options, read from vLLM's validated request (its defaults: no generation
# prompt, no special tokens added on top of the template's).
_CHAT_OPTIONS = (
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template",
    "chat_template_kwargs",
)


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

    def render(
        self, response_id: str, created: int, model: str, results: Sequence[EmbeddingResult]
    ) -> BaseModel | BinaryBody:
        return embedding_response(response_id, created, model, results, self)


class EmbeddingChatRequest(EmbeddingRequest):
    """The chat form: each of ``conversations`` rendered with the chat template is one prompt
    (``input`` stays empty: vLLM's chat requests have no text input)."""

    input: list[Any] = Field(default_factory=list)
    conversations: list[list[dict[str, Any]]]
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def prompts(self, tok: TextTokenizer, max_model_len: int) -> list[tuple[int, ...]]:
        cut = _cut(self, max_model_len)
        rendered = [
            render_chat(
                conversation,
                tok,
                add_generation_prompt=self.add_generation_prompt,
                continue_final_message=self.continue_final_message,
                chat_template=self.chat_template,
                add_special_tokens=self.add_special_tokens,
                chat_template_kwargs=self.chat_template_kwargs,
            )
            for conversation in self.conversations
        ]
        return [checked_prompt(ids, cut, max_model_len, "messages") for ids in rendered]


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


def parse_embedding_request(body: Mapping[str, Any], api: str = "embed") -> EmbeddingRequest:
    """The body as an ``EmbeddingRequest`` (its chat form: an ``EmbeddingChatRequest``); a refused
    or invalid field is a 400 naming it. ``api``: whose request union judges a chat form, vLLM's
    ``/v1/embeddings`` ("embed": ``messages``, batches, conversations in ``input``) or
    ``/pooling`` ("pooling": one conversation in ``messages``)."""
    if body.get("normalize") is not None:
        raise bad_request("Parameter `normalize` was removed; use `use_activation` instead.", "normalize")
    for name in REFUSED_FIELDS:
        if body.get(name) is not None:
            raise bad_request(f"`{name}` is not supported by this server's /v1/embeddings", name)
    if is_chat_form(body, api):
        req: EmbeddingRequest = _parse_chat(body, api)
    else:
        if isinstance(body.get("input"), list) and any(isinstance(x, dict) for x in body["input"]):
            raise bad_request("input: not a conversation vLLM's request accepts here", "input")
        req = _validate(EmbeddingRequest, body)
    if req.embed_dtype not in embed_dtypes():
        raise bad_request(f"embed_dtype {req.embed_dtype!r} is not one of {list(embed_dtypes())}", "embed_dtype")
    if req.priority != 0:
        raise bad_request("priority scheduling is not enabled on this server", "priority")
    return req


def is_chat_form(body: Mapping[str, Any], api: str = "embed") -> bool:
    """vLLM's chat forms: ``messages``, or (embeddings only) one or a batch of conversations
    in ``input`` (its ``_is_chat_messages`` / ``_is_batched_chat_messages``)."""
    if "messages" in body:
        return True
    if api != "embed":
        return False
    from vllm.entrypoints.pooling.embed.protocol import (  # deferred: vLLM only for a pooling body
        _is_batched_chat_messages,
        _is_chat_messages,
    )

    value = body.get("input")
    return bool(_is_chat_messages(value) or _is_batched_chat_messages(value))


@lru_cache(maxsize=2)
def _vllm_request_union(api: str) -> Any:
    """vLLM's request union for ``api`` as a ``TypeAdapter`` (built once: it is large)."""
    import pydantic

    # deferred: vLLM only when a pooling body is parsed
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingRequest as VllmEmbeddingRequest
    from vllm.entrypoints.pooling.pooling.protocol import PoolingRequest as VllmPoolingRequest

    return pydantic.TypeAdapter(VllmEmbeddingRequest if api == "embed" else VllmPoolingRequest)


def _parse_chat(body: Mapping[str, Any], api: str) -> EmbeddingChatRequest:
    """Validated by vLLM's own request union (which variant: one conversation or a batch; its
    options and their defaults), the conversations taken from the body as sent."""
    from vllm.exceptions import VLLMValidationError  # deferred: as above

    field = "messages" if "messages" in body else "input"
    try:
        vllm_req = _vllm_request_union(api).validate_python(dict(body))
    except VLLMValidationError as exc:
        raise bad_request(str(exc.args[0]) if exc.args else str(exc), exc.parameter or field) from None
    except ValidationError as exc:
        message = exc.errors()[0]["msg"]
        raise bad_request(f"{field}: not a conversation vLLM's request accepts ({message})", field) from None
    if not hasattr(vllm_req, "messages"):
        raise bad_request(f"{field}: not a conversation vLLM's request accepts", field)
    raw = body[field]
    batch = bool(raw) and all(isinstance(c, list) for c in raw)
    options = {k: getattr(vllm_req, k) for k in _CHAT_OPTIONS if k in type(vllm_req).model_fields}
    fields = {k: v for k, v in body.items() if k in EmbeddingRequest.model_fields and k != "input"}
    conversations = [list(c) for c in raw] if batch else [list(raw)]
    req: EmbeddingChatRequest = _validate(EmbeddingChatRequest, {**fields, **options, "conversations": conversations})
    return req


def _validate(cls: type[EmbeddingRequest], body: Mapping[str, Any]) -> Any:
    try:
        return cls.model_validate(dict(body))
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else None
        raise bad_request(f"{field}: {first['msg']}", field) from None


def _cut(req: EmbeddingRequest, max_model_len: int) -> Truncation | None:
    return truncation(req.truncate_prompt_tokens, req.truncation_side or POOLING_TRUNCATION_SIDE, 0, max_model_len)


def checked_prompt(ids: Sequence[int], cut: Truncation | None, max_model_len: int, field: str) -> tuple[int, ...]:
    """One prompt truncated as asked; empty or longer than ``max_model_len``: 400."""
    ids = tuple(ids) if cut is None else cut.apply(tuple(ids))
    if not ids:
        raise bad_request("an input is empty", field)
    if len(ids) > max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{len(ids)} tokens in the input for embedding generation. Please reduce the length of the input.",
            field,
        )
    return ids


def embedding_prompts(req: EmbeddingRequest, tok: TextTokenizer, max_model_len: int) -> list[tuple[int, ...]]:
    """Each input as token ids (texts tokenized with ``add_special_tokens``), truncated as asked."""
    items: Sequence[Any] = [req.input] if isinstance(req.input, str) or _is_ids(req.input) else req.input
    if not items:
        raise bad_request("You must pass at least one prompt", "input")
    cut = _cut(req, max_model_len)
    return [
        checked_prompt(
            tok.encode(item, add_special_tokens=req.add_special_tokens) if isinstance(item, str) else item,
            cut,
            max_model_len,
            "input",
        )
        for item in items
    ]


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(x, int) for x in value)


def encode_embedding(values: Sequence[float], req: EmbeddingRequest) -> list[float] | str:
    """One vector in a JSON body, as the request asks: floats, or base64 of its bytes."""
    return encode_vector(values, req.encoding_format, req.embed_dtype, req.endianness)


def embedding_response(
    request_id: str, created: int, model: str, results: Sequence[EmbeddingResult], req: EmbeddingRequest
) -> EmbeddingResponse | BinaryBody:
    if req.encoding_format in BYTES_FORMATS:
        return binary_body(request_id, created, model, results, req.encoding_format, req.embed_dtype, req.endianness)
    num_tokens = sum(r.num_prompt_tokens for r in results)
    data = [EmbeddingResponseData(index=i, embedding=encode_embedding(r.embedding, req)) for i, r in enumerate(results)]
    usage = UsageInfo(prompt_tokens=num_tokens, total_tokens=num_tokens, completion_tokens=0)
    return EmbeddingResponse(id=request_id, created=created, model=model, data=data, usage=usage)
