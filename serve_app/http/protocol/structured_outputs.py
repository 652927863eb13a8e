"""``structured_outputs`` (vLLM's extension) and ``response_format`` (OpenAI's) -> the contract's
``StructuredOutputSpec``, on both /v1/completions and /v1/chat/completions.

As vLLM's ``structured_outputs_from_response_format``: a ``response_format`` of type
``json_object`` / ``json_schema`` / ``structural_tag`` overrides the matching constraint of
``structured_outputs`` (the other options, e.g. ``disable_any_whitespace``, stay); ``text`` leaves
it alone. Errors name the field the constraint came from. Whether the spec compiles is checked
by the ingress (``accel.structured.grammar.check_spec``, off its event loop).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from accel.contract import InvalidRequestError, StructuredOutputSpec

STRUCTURED_OUTPUTS = "structured_outputs"
RESPONSE_FORMAT = "response_format"
_SPEC_KEYS = (
    "json",
    "regex",
    "choice",
    "grammar",
    "json_object",
    "structural_tag",
    "disable_any_whitespace",
    "disable_additional_properties",
    "whitespace_pattern",
)
_RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema", "structural_tag")


def structured_output_spec(
    structured_outputs: Mapping[str, Any] | None, response_format: Mapping[str, Any] | None
) -> StructuredOutputSpec | None:
    """The request's spec, or None when it asks for free text."""
    kwargs: dict[str, Any] = {}
    param = STRUCTURED_OUTPUTS
    if structured_outputs is not None:
        if not isinstance(structured_outputs, Mapping):
            raise InvalidRequestError(STRUCTURED_OUTPUTS, "must be an object")
        kwargs = {k: v for k, v in structured_outputs.items() if k in _SPEC_KEYS and v is not None}
        for flag in ("disable_any_whitespace", "disable_additional_properties"):
            if flag in kwargs and not isinstance(kwargs[flag], bool):
                raise InvalidRequestError(STRUCTURED_OUTPUTS, f"{flag} must be a boolean")
    overrides = _response_format_overrides(response_format)
    if overrides:
        kwargs.update(overrides)
        param = RESPONSE_FORMAT
    if not kwargs:
        return None if structured_outputs is None else StructuredOutputSpec(param=param)  # raises: no constraint
    return StructuredOutputSpec(**kwargs, param=param)


def _response_format_overrides(rf: Mapping[str, Any] | None) -> dict[str, Any]:
    if rf is None:
        return {}
    if not isinstance(rf, Mapping):
        raise InvalidRequestError(RESPONSE_FORMAT, "must be an object")
    kind = rf.get("type")
    if kind not in _RESPONSE_FORMAT_TYPES:
        raise InvalidRequestError(RESPONSE_FORMAT, f"type must be one of {list(_RESPONSE_FORMAT_TYPES)}, got {kind!r}")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        js = rf.get("json_schema")
        if js is None:
            raise InvalidRequestError(
                RESPONSE_FORMAT, "When response_format type is 'json_schema', the 'json_schema' field must be provided."
            )
        if not isinstance(js, Mapping) or not isinstance(js.get("name"), str):
            raise InvalidRequestError(RESPONSE_FORMAT, "json_schema must be an object with a string 'name'")
        schema = js.get("schema")
        if not isinstance(schema, Mapping):
            raise InvalidRequestError(RESPONSE_FORMAT, "json_schema.schema must be a JSON schema object")
        return {"json": schema}
    # structural_tag: the whole response_format is the tag (vLLM dumps the validated model)
    try:
        return {"structural_tag": json.dumps(dict(rf))}
    except (TypeError, ValueError):
        raise InvalidRequestError(RESPONSE_FORMAT, "structural_tag is not JSON-serializable") from None
