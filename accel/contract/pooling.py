"""What one pooling request asks for and gets back: ``EmbedRequest`` (token ids in, already
tokenized, as ``GenerateRequest``) -> ``EmbeddingResult`` (one pooled vector).

Only engines running vLLM's pooling runner serve it (``runner: pooling``, e.g. with
``convert: embed``); every other engine refuses it naming ``model``.
"""

from __future__ import annotations

from dataclasses import dataclass

from accel.contract.errors import is_int, normalize_token_ids, require


@dataclass(frozen=True)
class EmbedRequest:
    """One prompt to embed. ``dimensions``: vLLM's Matryoshka truncation (None: the model's
    full size; a model that is not Matryoshka refuses any value, as vLLM does).
    ``use_activation``: vLLM's pooler activation (normalization for embed; None: the pooler's
    default, True)."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    dimensions: int | None = None
    use_activation: bool | None = None

    def __post_init__(self) -> None:
        require(isinstance(self.request_id, str) and bool(self.request_id), "request_id", "must be a non-empty string")
        ids = normalize_token_ids(self.prompt_token_ids, "input")
        require(len(ids) > 0, "input", "the prompt is empty")
        object.__setattr__(self, "prompt_token_ids", ids)
        require(
            self.dimensions is None or (is_int(self.dimensions) and self.dimensions >= 1),
            "dimensions",
            "must be a positive integer",
        )
        require(
            self.use_activation is None or isinstance(self.use_activation, bool),
            "use_activation",
            "must be true or false",
        )

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class EmbeddingResult:
    """The pooled vector of one ``EmbedRequest`` (``embedding``: float32 values as Python
    floats, length = the model's embedding size or the request's ``dimensions``)."""

    request_id: str
    embedding: tuple[float, ...]
    num_prompt_tokens: int
