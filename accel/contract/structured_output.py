"""Per-request structured output (guided decoding): ``StructuredOutputSpec``, spelled as vLLM's
``StructuredOutputsParams``.

Exactly one constraint: ``json`` (a JSON schema, kept as its JSON text so the spec stays frozen
and hashable; key order is preserved because it orders the generated object's properties),
``regex``, ``choice``, ``grammar`` (EBNF/GBNF or Lark, as vLLM's xgrammar backend tells them
apart), ``json_object`` (any JSON object) or ``structural_tag`` (xgrammar's structural-tag JSON).
The spec is carried in ``SamplingParams.structured_outputs``; whether it compiles is checked at
the HTTP edge (``accel.structured.grammar.check_spec``) and it is compiled by the engine.

``reasoning_end_token_ids``: when set, the constraint starts only after the output contains this
token sequence (a reasoning model's end-of-thinking marker, e.g. ``</think>``), as vLLM does when
a reasoning parser is configured. Empty = constrained from the first output token.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accel.contract.errors import InvalidRequestError, normalize_token_ids, require


class StructuredOutputKind(enum.Enum):
    JSON = "json"
    REGEX = "regex"
    CHOICE = "choice"
    GRAMMAR = "grammar"
    JSON_OBJECT = "json_object"
    STRUCTURAL_TAG = "structural_tag"


_CONSTRAINTS = tuple(k.value for k in StructuredOutputKind)


@dataclass(frozen=True)
class StructuredOutputSpec:
    json: str | None = None  # JSON schema text (a mapping is serialized on construction)
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    reasoning_end_token_ids: tuple[int, ...] = ()
    # The request field the spec came from ("structured_outputs" or "response_format"): errors
    # about the spec name it.
    param: str = "structured_outputs"

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        p = self.param
        if self.json is not None and not isinstance(self.json, str):
            require(isinstance(self.json, Mapping), p, "json must be a JSON schema object or its JSON text")
            try:
                set_(self, "json", json.dumps(self.json))
            except (TypeError, ValueError) as exc:
                raise InvalidRequestError(p, f"json schema is not JSON-serializable: {exc}") from None
        if self.choice is not None:
            require(
                isinstance(self.choice, Sequence)
                and not isinstance(self.choice, str)
                and all(isinstance(c, str) for c in self.choice),
                p,
                "choice must be a list of strings",
            )
            require(len(self.choice) > 0, p, "choice must not be empty")
            set_(self, "choice", tuple(self.choice))
        for name in ("regex", "grammar", "structural_tag", "whitespace_pattern"):
            value = getattr(self, name)
            require(value is None or isinstance(value, str), p, f"{name} must be a string")
        require(self.json_object is None or isinstance(self.json_object, bool), p, "json_object must be a boolean")
        set_(self, "reasoning_end_token_ids", normalize_token_ids(self.reasoning_end_token_ids, p))
        count = sum(getattr(self, k) is not None for k in _CONSTRAINTS)
        # vLLM's wording (StructuredOutputsParams.__post_init__)
        require(count <= 1, p, "You can only use one kind of structured outputs constraint but multiple are specified")
        require(count == 1, p, "You must use one kind of structured outputs constraint but none are specified")

    @property
    def kind(self) -> StructuredOutputKind:
        return next(StructuredOutputKind(k) for k in _CONSTRAINTS if getattr(self, k) is not None)

    def schema(self) -> Any:
        """The JSON schema as an object (``json`` kind only)."""
        assert self.json is not None
        return json.loads(self.json)
