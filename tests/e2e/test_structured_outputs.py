"""End to end: structured outputs through Ray Serve with the official ``openai`` client, on both
pools (``x-meshserve-pool: tt`` / ``vllm``) of a ``configs/tiny.yaml``-like app (one replica
per pool): json_schema (``response_format``), regex and choice (``structured_outputs``) outputs
validate, and a schema that does not compile is a 400 naming its field.

The vLLM pool runs vLLM's xgrammar backend with ``disable_any_whitespace`` (an engine-level
setting in vLLM); requests ask the TT pool for the same per request, so both pools build the
same grammar (the tiny model is random: free whitespace would let it ramble to max_tokens).
"""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from tests.doubles.app_args import local_app_args, pin
from tests.doubles.deployed_app import deployed_app

pytestmark = pytest.mark.slow

APP = "meshserve-e2e-structured"
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "enum": ["yes", "no"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["answer", "count"],
    "additionalProperties": False,
}
COMPACT = {"structured_outputs": {"disable_any_whitespace": True}}


@pytest.fixture(scope="module")
def client(serve_session):
    args = local_app_args()
    for pool in args["pools"]:
        pool["replicas"] = 1
        if pool["engine"] == "vllm":
            pool["engine_args"]["structured_outputs_config"] = {"backend": "xgrammar", "disable_any_whitespace": True}
    with deployed_app(serve_session, APP, args, "/e2e-so") as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.parametrize("pool", ["tt", "vllm"])
def test_chat_json_schema(client, pool):
    r = client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": "Answer in JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}},
        max_tokens=48,
        temperature=0,
        extra_body=COMPACT,
        extra_headers=pin(pool),
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


@pytest.mark.parametrize("pool", ["tt", "vllm"])
def test_completion_regex_and_choice(client, pool):
    regex = r"[a-c]{2}-[0-9]{1,3}"
    r = client.completions.create(
        model="tiny-llama",
        prompt="The code is",
        max_tokens=24,
        temperature=0,
        extra_body={"structured_outputs": {"regex": regex}},
        extra_headers=pin(pool),
    )
    assert r.choices[0].finish_reason == "stop" and re.fullmatch(regex, r.choices[0].text)
    choices = ["yes", "no"]
    r = client.completions.create(
        model="tiny-llama",
        prompt="Is it raining?",
        max_tokens=8,
        temperature=0.8,
        seed=1,
        n=2,
        extra_body={"structured_outputs": {"choice": choices}},
        extra_headers=pin(pool),
    )
    assert all(c.text in choices and c.finish_reason == "stop" for c in r.choices)


def test_uncompilable_schema_is_a_400_naming_the_field(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="tiny-llama",
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}},
        )
    assert err.value.param == "response_format"
