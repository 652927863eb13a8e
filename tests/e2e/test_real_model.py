"""What a person sees on the real default model (``configs/local.yaml``: SmolLM2-135M-Instruct),
through the official ``openai`` client, on each pool, next to a bare vLLM 0.32 server started on
the same checkpoint with the vLLM pool's engine args: a factual answer; greedy chat, completions
and Responses output identical to bare vLLM's (and to HF's tokens); ``json_schema`` and
``json_object`` outputs that parse and validate; ``tool_choice`` ``required`` and named with
valid arguments; streamed text equal to non-streamed.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from tests.doubles.app_args import pin, real_model_app_args
from tests.doubles.deployed_app import deployed_app
from tests.e2e.bare_vllm import bare_vllm_server
from tests.hf_reference import hf_greedy, vllm_text

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
APP = "meshserve-e2e-real-model"
POOLS = ("tt", "vllm")
QUESTIONS = (
    "What is the capital of France?",
    "Name three planets of the solar system.",
    "Write one sentence about autumn.",
)
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        # Strict: vLLM 0.32's hermes parser forces the call's JSON shape for required/named choices,
        # but constrains the arguments to the schema only for a strict tool (tool_strict_level
        # "auto"); without it SmolLM2 writes `"arguments": "celsius"`, on bare vLLM as on ours.
        "strict": True,
    },
}


@pytest.fixture(scope="module")
def app_args():
    return real_model_app_args()


@pytest.fixture(scope="module")
def ours(serve_session, smollm2, app_args):
    with deployed_app(serve_session, APP, app_args, "/e2e-real", engine_replicas=2, timeout_s=300) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def bare(smollm2, app_args, tmp_path_factory):
    (vllm_pool,) = [p for p in app_args["pools"] if p["engine"] == "vllm"]
    (model,) = app_args["models"]
    log = tmp_path_factory.mktemp("bare-vllm") / "server.log"
    flags = {**vllm_pool["engine_args"], **{k: model[k] for k in ("enable_auto_tool_choice", "tool_call_parser")}}
    with bare_vllm_server(smollm2, MODEL, flags, log) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return AutoTokenizer.from_pretrained(smollm2)


def chat(client, pool, content, **kw):
    headers = pin(pool) if pool else None
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        temperature=0,
        max_tokens=kw.pop("max_tokens", 40),
        extra_headers=headers,
        **kw,
    )


@pytest.mark.parametrize("pool", POOLS)
def test_a_factual_answer(ours, pool):
    answer = chat(ours, pool, "What is the capital of France?").choices[0]
    assert answer.message.content == "The capital of France is Paris."
    assert answer.finish_reason == "stop"


@pytest.mark.parametrize("pool", POOLS)
def test_greedy_chat_equals_bare_vllm_and_hf(ours, bare, pool, smollm2, tokenizer):
    for question in QUESTIONS:
        mine, ref = chat(ours, pool, question), chat(bare, None, question)
        assert mine.choices[0].message.content == ref.choices[0].message.content, question
        assert (mine.usage.prompt_tokens, mine.usage.completion_tokens) == (
            ref.usage.prompt_tokens,
            ref.usage.completion_tokens,
        )
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, return_dict=False
        )
        hf = hf_greedy(smollm2, prompt, 40, eos_token_ids=frozenset({tokenizer.eos_token_id}), ignore_eos=False)
        expected = vllm_text(smollm2, prompt, [t for t in hf if t != tokenizer.eos_token_id])
        assert mine.choices[0].message.content == expected, question


@pytest.mark.parametrize("pool", POOLS)
def test_greedy_completions_equal_bare_vllm(ours, bare, pool):
    for prompt in ("The three largest oceans on Earth are", "def fibonacci(n):\n"):
        kw = dict(model=MODEL, prompt=prompt, max_tokens=32, temperature=0)
        mine = ours.completions.create(**kw, extra_headers=pin(pool))
        assert mine.choices[0].text == bare.completions.create(**kw).choices[0].text, prompt


@pytest.mark.parametrize("pool", POOLS)
def test_streamed_text_equals_non_streamed(ours, pool):
    whole = chat(ours, pool, QUESTIONS[1]).choices[0].message.content
    stream = chat(ours, pool, QUESTIONS[1], stream=True)
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len([p for p in pieces if p]) > 5  # token by token, not one chunk
    assert "".join(pieces) == whole


@pytest.mark.parametrize("pool", POOLS)
def test_json_schema_output_parses_validates_and_equals_bare(ours, bare, pool):
    kw = dict(
        response_format={"type": "json_schema", "json_schema": {"name": "capital", "schema": CITY_SCHEMA}},
        max_tokens=60,
    )
    question = "Give the capital of France as JSON with the keys city and country."
    mine = chat(ours, pool, question, **kw).choices[0]
    assert mine.finish_reason == "stop"  # the grammar closed the object: no run to max_tokens
    value = json.loads(mine.message.content)
    jsonschema.validate(value, CITY_SCHEMA)
    assert mine.message.content == chat(bare, None, question, **kw).choices[0].message.content


@pytest.mark.parametrize("pool", POOLS)
def test_json_object_output_parses(ours, bare, pool):
    kw = dict(response_format={"type": "json_object"}, max_tokens=80)
    question = "Describe a cat as a JSON object with its name and age."
    mine = chat(ours, pool, question, **kw).choices[0]
    assert mine.finish_reason == "stop"
    assert isinstance(json.loads(mine.message.content), dict)
    assert mine.message.content == chat(bare, None, question, **kw).choices[0].message.content


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_calls_have_valid_arguments(ours, bare, pool, tool_choice):
    kw = dict(tools=[WEATHER_TOOL], tool_choice=tool_choice, max_tokens=80)
    question = "What is the weather in Paris in celsius?"
    mine = chat(ours, pool, question, **kw).choices[0]
    assert mine.finish_reason == ("tool_calls" if tool_choice == "required" else "stop")  # as vLLM
    (call,) = mine.message.tool_calls
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER_TOOL["function"]["parameters"])
    (ref,) = chat(bare, None, question, **kw).choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == (ref.function.name, ref.function.arguments)


@pytest.mark.parametrize("pool", POOLS)
def test_responses_api_equals_bare_vllm(ours, bare, pool):
    kw = dict(model=MODEL, input="What is the capital of France?", max_output_tokens=40, temperature=0)
    mine = ours.responses.create(**kw, extra_headers=pin(pool))
    assert mine.status == "completed"
    assert mine.output_text == bare.responses.create(**kw).output_text
    assert "Paris" in mine.output_text
