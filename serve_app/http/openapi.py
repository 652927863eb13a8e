"""The request models in the ingress's OpenAPI schema (``/openapi.json``), without letting FastAPI
parse the body: the endpoints read the raw JSON themselves (vLLM's 400 for a bad field, not
FastAPI's 422; the field policy sees the fields as sent), so the models are declared through
``openapi_extra`` as a ``requestBody`` whose schema is the pydantic model's, references inlined
(the schema must stand on its own inside the document). Clients, generators and fuzzers
(schemathesis, tests/e2e/test_ingress_edge.py) read it there."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: _inline(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` of an endpoint whose JSON body is ``model`` (models without recursion)."""
    schema = model.model_json_schema()
    inlined = _inline(schema, schema.get("$defs", {}))
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": inlined}}}}
