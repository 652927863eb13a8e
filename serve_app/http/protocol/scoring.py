"""``/score`` and ``/rerank`` as vLLM 0.32 serves them for an embedding model
(``vllm/entrypoints/pooling/scoring``: its bi-encoder path): every text is embedded on its own
and each (query, document) pair scores the cosine similarity of their vectors (one query against
N documents, or N against N).

Score bodies: ``queries``/``documents``, ``queries``/``items``, ``data_1``/``data_2`` or
``text_1``/``text_2``; rerank: ``query``, ``documents``, ``top_n`` (results best first, the
first ``top_n``; 0: all). Usage counts every embedded prompt once, as vLLM does. Honoured:
``truncate_prompt_tokens`` / ``truncation_side`` (per prompt), ``use_activation``,
``request_id``, ``user``. Refused with a 400 naming the field: multimodal inputs,
``max_tokens_per_query`` / ``max_tokens_per_doc``, ``instruction`` and ``chat_template_kwargs``
(cross-encoder templates), ``padding``, ``mm_processor_kwargs``, ``cache_salt``, ``priority``
other than 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from accel.contract import EmbeddingResult
from accel.text.tokenizer import TextTokenizer
from serve_app.http.protocol.common import OpenAIBaseModel, UsageInfo
from serve_app.http.protocol.embeddings import POOLING_TRUNCATION_SIDE
from serve_app.http.protocol.errors import bad_request
from serve_app.http.protocol.truncation import truncation

SCORE_PAIRS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2"))
REFUSED_FIELDS = ("instruction", "chat_template_kwargs", "padding", "mm_processor_kwargs", "cache_salt")
_NONZERO_REFUSED = ("max_tokens_per_query", "max_tokens_per_doc", "priority")


class ScoringRequest(OpenAIBaseModel):
    """What score and rerank share; ``texts_1`` / ``texts_2``: the two sides, as parsed."""

    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    truncation_side: str | None = None
    request_id: str | None = None
    use_activation: bool | None = None
    texts_1: list[str]
    texts_2: list[str]

    @property
    def dimensions(self) -> None:
        return None  # the full vectors: cosine similarity is taken on them

    def prompts(self, tok: TextTokenizer, max_model_len: int) -> list[tuple[int, ...]]:
        """Every text of side 1, then every text of side 2, tokenized as vLLM does for pooling."""
        cut = truncation(self.truncate_prompt_tokens, self.truncation_side or POOLING_TRUNCATION_SIDE, 0, max_model_len)
        prompts = []
        for text in [*self.texts_1, *self.texts_2]:
            ids = tuple(tok.encode(text))
            ids = ids if cut is None else cut.apply(ids)
            if len(ids) > max_model_len:
                raise bad_request(
                    f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                    f"{len(ids)} tokens in the input for scoring. Please reduce the length of the input.",
                    "input",
                )
            prompts.append(ids)
        return prompts

    def pair_scores(self, results: Sequence[EmbeddingResult]) -> list[float]:
        """Cosine similarity per pair (torch's ``cosine_similarity``: eps 1e-8, float32)."""
        side_1, side_2 = results[: len(self.texts_1)], results[len(self.texts_1) :]
        if len(side_1) == 1:
            side_1 = list(side_1) * len(side_2)
        return [_cosine(a.embedding, b.embedding) for a, b in zip(side_1, side_2)]


_R = TypeVar("_R", bound=ScoringRequest)


class ScoreResponseData(OpenAIBaseModel):
    index: int
    object: str = "score"
    score: float


class ScoreResponse(OpenAIBaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ScoreResponseData]
    usage: UsageInfo


class ScoreRequest(ScoringRequest):
    def render(self, response_id: str, created: int, model: str, results: Sequence[EmbeddingResult]) -> BaseModel:
        data = [ScoreResponseData(index=i, score=s) for i, s in enumerate(self.pair_scores(results))]
        num_tokens = sum(r.num_prompt_tokens for r in results)
        usage = UsageInfo(prompt_tokens=num_tokens, total_tokens=num_tokens, completion_tokens=0)
        return ScoreResponse(id=response_id, created=created, model=model, data=data, usage=usage)


class RerankDocument(BaseModel):
    text: str | None = None
    multi_modal: list[Any] | None = None


class RerankResult(BaseModel):
    index: int
    document: RerankDocument
    relevance_score: float


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(OpenAIBaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class RerankRequest(ScoringRequest):
    top_n: int = Field(default=0, ge=0)

    def render(self, response_id: str, created: int, model: str, results: Sequence[EmbeddingResult]) -> BaseModel:
        del created  # (vLLM's rerank body has none)
        scores = self.pair_scores(results)
        ranked = [
            RerankResult(index=i, document=RerankDocument(text=t), relevance_score=s)
            for i, (t, s) in enumerate(zip(self.texts_2, scores))
        ]
        ranked.sort(key=lambda r: r.relevance_score, reverse=True)
        if 0 < self.top_n < len(ranked):
            ranked = ranked[: self.top_n]
        num_tokens = sum(r.num_prompt_tokens for r in results)
        return RerankResponse(
            id=response_id,
            model=model,
            usage=RerankUsage(prompt_tokens=num_tokens, total_tokens=num_tokens),
            results=ranked,
        )


def parse_score_request(body: Mapping[str, Any]) -> ScoreRequest:
    pair = next((p for p in SCORE_PAIRS if p[0] in body and p[1] in body), None)
    if pair is None:
        raise bad_request(f"a score request needs one of the pairs {[f'{a}/{b}' for a, b in SCORE_PAIRS]}", "queries")
    return _parse(ScoreRequest, body, pair)


def parse_rerank_request(body: Mapping[str, Any]) -> RerankRequest:
    if "query" not in body or "documents" not in body:
        raise bad_request("a rerank request needs query and documents", "query" if "query" not in body else "documents")
    if isinstance(body["query"], list):
        raise bad_request("query must be one text", "query")
    return _parse(RerankRequest, body, ("query", "documents"))


def _parse(cls: type[_R], body: Mapping[str, Any], pair: tuple[str, str]) -> _R:
    _check_refused(body)
    side_1, side_2 = (_texts(body[name], name) for name in pair)
    if len(side_1) > 1 and len(side_1) != len(side_2):
        raise bad_request("Input lengths must be either 1:1, 1:N or N:N", pair[0])
    if not side_1 or not side_2:
        raise bad_request("At least one text element must be given on each side", pair[0] if not side_1 else pair[1])
    fields = {k: v for k, v in body.items() if k in cls.model_fields}
    try:
        return cls.model_validate({**fields, "texts_1": side_1, "texts_2": side_2})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else None
        raise bad_request(f"{field}: {first['msg']}", field) from None


def _check_refused(body: Mapping[str, Any]) -> None:
    for name in REFUSED_FIELDS:
        if body.get(name) is not None:
            raise bad_request(f"`{name}` is not supported by this server's scoring (embedding models)", name)
    for name in _NONZERO_REFUSED:
        if body.get(name):
            raise bad_request(f"`{name}` is not supported by this server's scoring", name)


def _texts(value: Any, name: str) -> list[str]:
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) for v in items):
        raise bad_request(f"{name}: only text inputs are supported here (no multimodal content)", name)
    return list(items)


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    x, y = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    denominator = max(float(np.linalg.norm(x)) * float(np.linalg.norm(y)), 1e-8)
    return float(np.float32(np.dot(x, y) / denominator))
