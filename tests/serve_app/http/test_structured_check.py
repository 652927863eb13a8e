"""The ingress compile-checks structured-output specs: a spec that does not compile is a 400
naming the field it came from, before any engine is asked."""

from __future__ import annotations

import asyncio
import json

import pytest

from serve_app.http.pipeline.endpoints import COMPLETIONS
from tests.serve_app.http.test_openai_ingress_rejects import _ingress, _request


@pytest.mark.parametrize(
    "body, param",
    [
        ({"structured_outputs": {"json": {"type": "objekt"}}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs"),
        ({"structured_outputs": {"grammar": "root ::= "}}, "structured_outputs"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
            "response_format",
        ),
        ({"allowed_token_ids": [5, 10**6]}, "allowed_token_ids"),
        ({"bad_words": [""]}, "bad_words"),
    ],
)
def test_uncompilable_spec_is_a_400_naming_the_field(tiny_llama, body, param):
    ingress, metrics = _ingress(tiny_llama)
    response = asyncio.run(ingress._run(_request({"prompt": "hi", **body}), COMPLETIONS))
    assert response.status_code == 400
    error = json.loads(response.body)["error"]
    assert error["param"] == param and error["type"] == "BadRequestError"
    assert metrics.rejects == [("tiny-llama", 400)]
