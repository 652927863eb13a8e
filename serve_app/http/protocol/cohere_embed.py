"""Cohere's ``POST /v2/embed`` as vLLM 0.32 serves it for an embedding model
(``vllm/entrypoints/pooling/embed``: its ``CohereEmbedRequest``, ``EmbedIOProcessor``'s Cohere
path and ``ServingEmbedding._build_cohere_response_from_ctx``). The body is validated by vLLM's
own request model and the answer built by vLLM's ``build_typed_embeddings`` and response models.

- ``texts``: each text one prompt (special tokens added); with an ``input_type`` whose task
  instruction the model defines (``task_instructions`` in its config.json, or the ``prompts`` of
  its ``config_sentence_transformers.json``), the instruction is the system message of a chat
  rendering when the model has a chat template, else a prefix of the text. An ``input_type`` the
  model does not define is a 400 naming it, as vLLM's.
- ``inputs`` (text content only): each rendered as one user message with the chat template.
- ``truncate``: ``END`` (default) keeps the first ``max_tokens`` (or max_model_len) tokens,
  ``START`` the last, ``NONE`` none (a prompt over ``max_tokens`` is then a 400, as vLLM's check).
- ``output_dimension``: Matryoshka ``dimensions``; ``embedding_types``: any of ``float``,
  ``binary``, ``ubinary``, ``base64`` (default ``float``).
- Refused with a 400 naming the field: ``images`` and image content in ``inputs`` (no
  multimodal pooling here), ``priority`` other than 0.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from accel.contract import EmbeddingResult
from accel.text.tokenizer import TextTokenizer
from serve_app.http.protocol.conversion import render_chat
from serve_app.http.protocol.embeddings import POOLING_TRUNCATION_SIDE, checked_prompt
from serve_app.http.protocol.errors import bad_request
from serve_app.http.protocol.truncation import truncation


@dataclass(frozen=True)
class CohereEmbedCall:
    """A parsed ``/v2/embed`` body (``req``: vLLM's validated ``CohereEmbedRequest``)."""

    req: Any
    request_id: None = None  # (Cohere's body has none: the X-Request-Id header or a new id)
    use_activation: None = None  # (vLLM's Cohere pooling params leave the pooler's default)

    @property
    def model(self) -> str | None:
        return self.req.model  # type: ignore[no-any-return]

    @property
    def dimensions(self) -> int | None:
        return self.req.output_dimension  # type: ignore[no-any-return]

    def prompts(self, tok: TextTokenizer, max_model_len: int) -> list[tuple[int, ...]]:
        req, prefix = self.req, _task_prefix(self.req.input_type, tok)
        keep, side = _truncation(req)
        cut = truncation(keep, side or POOLING_TRUNCATION_SIDE, 0, max_model_len)
        if req.texts is not None and (prefix is None or not _has_chat_template(tok)):
            field = "texts"
            ids: list[Sequence[int]] = [tok.encode((prefix or "") + text) for text in req.texts]
        else:
            field = "texts" if req.texts is not None else "inputs"
            parts = [[{"type": "text", "text": t}] for t in req.texts] if req.texts is not None else _input_parts(req)
            ids = [_render(parts_of_one, prefix, tok) for parts_of_one in parts]
        prompts = [checked_prompt(one, cut, max_model_len, field) for one in ids]
        if req.truncate == "NONE" and req.max_tokens is not None:
            for prompt in prompts:
                if len(prompt) > req.max_tokens:
                    raise bad_request(
                        f"Input of {len(prompt)} tokens exceeds max_tokens={req.max_tokens} with truncate=NONE. "
                        "Set truncate to END or START to allow truncation.",
                        "max_tokens",
                    )
        return prompts

    def render(self, response_id: str, created: int, model: str, results: Sequence[EmbeddingResult]) -> dict[str, Any]:
        """vLLM's Cohere body (its ``None`` fields left out)."""
        from vllm.entrypoints.pooling.embed.protocol import (  # deferred: vLLM only for a pooling body
            CohereBilledUnits,
            CohereEmbedResponse,
            CohereMeta,
            build_typed_embeddings,
        )

        del created, model  # (Cohere's body has neither)
        floats = [list(r.embedding) for r in results]
        try:
            embeddings = build_typed_embeddings(floats, self.req.embedding_types or ["float"])
        except ValueError as exc:  # a binary type on a size that is not a multiple of 8
            raise bad_request(str(exc), "embedding_types") from None
        tokens = sum(r.num_prompt_tokens for r in results)
        meta = CohereMeta(billed_units=CohereBilledUnits(input_tokens=tokens, image_tokens=0))
        response = CohereEmbedResponse(id=response_id, embeddings=embeddings, texts=self.req.texts, meta=meta)
        return response.model_dump(exclude_none=True)


def parse_cohere_request(body: Mapping[str, Any]) -> CohereEmbedCall:
    """The body as vLLM's ``CohereEmbedRequest``; an invalid or refused field is a 400 naming it."""
    from vllm.entrypoints.pooling.embed.protocol import CohereEmbedRequest  # deferred: as above

    try:
        req = CohereEmbedRequest.model_validate(dict(body))
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "texts"
        raise bad_request(f"{field}: {first['msg']}", field) from None
    if req.images is not None:
        raise bad_request("images are not supported here (no multimodal embedding models)", "images")
    if any(c.type != "text" for item in req.inputs or [] for c in item.content):
        raise bad_request("inputs: only text content is supported here (no multimodal embedding models)", "inputs")
    if req.priority != 0:
        raise bad_request("priority scheduling is not enabled on this server", "priority")
    return CohereEmbedCall(req)


def _truncation(req: Any) -> tuple[int | None, str | None]:
    """vLLM's ``_resolve_cohere_truncation``: (truncate_prompt_tokens, truncation_side)."""
    if req.truncate == "NONE":
        return None, None
    keep = req.max_tokens if req.max_tokens is not None else -1
    return keep, ("left" if req.truncate == "START" else None)


def _input_parts(req: Any) -> list[list[dict[str, Any]]]:
    return [[{"type": "text", "text": c.text} for c in item.content] for item in req.inputs]


def _render(parts: list[dict[str, Any]], prefix: str | None, tok: TextTokenizer) -> tuple[int, ...]:
    """One Cohere input as vLLM's ``_mixed_input_to_messages`` builds it, rendered as a pooling
    chat request (no generation prompt, no special tokens on top of the template's)."""
    system = [{"role": "system", "content": [{"type": "text", "text": prefix}]}] if prefix is not None else []
    messages = [*system, {"role": "user", "content": parts}]
    return render_chat(
        messages,
        tok,
        add_generation_prompt=False,
        continue_final_message=False,
        chat_template=None,
        add_special_tokens=False,
    )


def _has_chat_template(tok: TextTokenizer) -> bool:
    return bool(tok.hf.chat_template)


def _task_prefix(input_type: str | None, tok: TextTokenizer) -> str | None:
    """The task instruction for ``input_type`` (vLLM's ``_validate_input_type`` and
    ``_get_task_instruction_prefix``)."""
    if input_type is None:
        return None
    instructions = task_instructions(str(tok.hf.name_or_path))
    if instructions is None:
        raise bad_request(
            f"Unsupported input_type {input_type!r}. This model does not define any input_type task instructions.",
            "input_type",
        )
    if input_type not in instructions:
        supported = ", ".join(sorted(instructions))
        raise bad_request(f"Unsupported input_type {input_type!r}. Supported values: {supported}", "input_type")
    return instructions[input_type] or None


@lru_cache(maxsize=8)
def task_instructions(model_dir: str) -> dict[str, str] | None:
    """What vLLM's ``EmbedIOProcessor`` loads: ``task_instructions`` from the HF config, else the
    ``prompts`` of ``config_sentence_transformers.json`` (their string values; neither: None)."""
    found = [_strings_of(Path(model_dir) / name, key) for name, key in _INSTRUCTION_SOURCES]
    return found[0] or found[1]


_INSTRUCTION_SOURCES = (("config.json", "task_instructions"), ("config_sentence_transformers.json", "prompts"))


def _strings_of(path: Path, key: str) -> dict[str, str] | None:
    value = json.loads(path.read_text()).get(key) if path.is_file() else None
    if not isinstance(value, dict) or not value:
        return None
    return {k: v for k, v in value.items() if isinstance(v, str)}
