"""``structured_outputs`` / ``response_format`` / ``allowed_token_ids`` / ``bad_words`` on both
endpoints -> ``SamplingParams``, as vLLM 0.32's request models map them."""

from __future__ import annotations

import json

import pytest

from accel.contract import InvalidRequestError, StructuredOutputKind
from accel.text.tokenizer import load_tokenizer
from serve_app.http.protocol import conversion as conv
from serve_app.http.protocol.chat import ChatCompletionRequest
from serve_app.http.protocol.completions import CompletionRequest

SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return load_tokenizer(str(tiny_llama))


def _sampling(body: dict, tok, chat: bool):
    if chat:
        req = conv.parse_body(ChatCompletionRequest, {"messages": MESSAGES, **body})
    else:
        req = conv.parse_body(CompletionRequest, {"prompt": "hi", **body})
    return conv.sampling_params(req, 3, 512, tok)


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize(
    "body, kind, param",
    [
        ({"structured_outputs": {"choice": ["yes", "no"]}}, StructuredOutputKind.CHOICE, "structured_outputs"),
        ({"structured_outputs": {"regex": "[0-9]+"}}, StructuredOutputKind.REGEX, "structured_outputs"),
        ({"structured_outputs": {"json": SCHEMA}}, StructuredOutputKind.JSON, "structured_outputs"),
        ({"structured_outputs": {"grammar": 'root ::= "a"'}}, StructuredOutputKind.GRAMMAR, "structured_outputs"),
        ({"structured_outputs": {"json_object": True}}, StructuredOutputKind.JSON_OBJECT, "structured_outputs"),
        ({"response_format": {"type": "json_object"}}, StructuredOutputKind.JSON_OBJECT, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}},
            StructuredOutputKind.JSON,
            "response_format",
        ),
        (
            {
                "structured_outputs": {"disable_any_whitespace": True},
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
            },
            StructuredOutputKind.JSON,
            "response_format",
        ),
    ],
)
def test_fields_become_the_spec(tok, chat, body, kind, param):
    spec = _sampling(body, tok, chat).structured_outputs
    assert spec is not None and spec.kind is kind and spec.param == param
    if kind is StructuredOutputKind.JSON:
        assert list(json.loads(spec.json)["properties"]) == ["b", "a"]
    if "disable_any_whitespace" in body.get("structured_outputs", {}):
        assert spec.disable_any_whitespace  # response_format overrides only the constraint


@pytest.mark.parametrize("chat", [False, True])
def test_free_text(tok, chat):
    assert _sampling({"response_format": {"type": "text"}}, tok, chat).structured_outputs is None
    assert _sampling({}, tok, chat).structured_outputs is None


@pytest.mark.parametrize(
    "body, param",
    [
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {"choice": "ab"}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"bad_words": [""]}, "bad_words"),
    ],
)
def test_bad_fields_name_themselves(tok, body, param):
    for chat in (False, True):
        with pytest.raises(InvalidRequestError) as err:
            _sampling(body, tok, chat)
        assert err.value.field == param


def test_allowed_token_ids_and_bad_words(tok):
    sp = _sampling({"allowed_token_ids": [5, 6], "bad_words": ["hello", "hello"]}, tok, chat=False)
    assert sp.allowed_token_ids == (5, 6) and sp.bad_words == ("hello",)
    assert sp.bad_words_token_ids and all(sp.bad_words_token_ids)
