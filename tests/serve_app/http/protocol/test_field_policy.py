"""Field by field against vLLM 0.32's own request models (imported from the installed vllm):
every field vLLM accepts is honoured (our model parses it) or refused (a request using it gets a
400 naming it), never dropped; unknown fields stay ignored, as vLLM ignores them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from serve_app.http.protocol import conversion as conv
from serve_app.http.protocol import field_policy as fp
from serve_app.http.protocol.chat import ChatCompletionRequest
from serve_app.http.protocol.completions import CompletionRequest
from serve_app.http.protocol.errors import APIError

BASE = {
    True: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    False: {"model": "m", "prompt": "hi"},
}
TABLES = {True: fp.CHAT_FIELDS, False: fp.COMPLETION_FIELDS}
OURS: dict[bool, type[BaseModel]] = {True: ChatCompletionRequest, False: CompletionRequest}


@pytest.fixture(scope="module")
def vllm_models() -> dict[bool, type[BaseModel]]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VChat
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest as VCompletion

    return {True: VChat, False: VCompletion}


def _cases(kind: type) -> list[Any]:
    return [
        pytest.param(is_chat, name, id=f"{'chat' if is_chat else 'completions'}-{name}")
        for is_chat in (True, False)
        for name, policy in TABLES[is_chat].items()
        if isinstance(policy, kind)
    ]


@pytest.mark.parametrize("is_chat", [True, False], ids=["chat", "completions"])
def test_every_vllm_field_is_classified(vllm_models, is_chat):
    theirs = set(vllm_models[is_chat].model_fields)
    ours = set(TABLES[is_chat])
    assert sorted(theirs - ours) == [], "fields vLLM accepts that we neither honour nor refuse"
    assert sorted(ours - theirs) == [], "classified fields vLLM 0.32 does not have"


@pytest.mark.parametrize("is_chat, name", _cases(fp.Honoured))
def test_honoured_fields_are_parsed(is_chat, name):
    assert name in OURS[is_chat].model_fields, f"{name} is marked honoured but our model would drop it"


@pytest.mark.parametrize("is_chat, name", _cases(fp.Refused))
def test_refused_fields_are_a_400_naming_them(vllm_models, is_chat, name):
    policy = TABLES[is_chat][name]
    assert isinstance(policy, fp.Refused)
    # The field first: ``check_fields`` names the first used refused field in body order.
    body = {name: policy.example, **BASE[is_chat], **(policy.example_needs or {})}
    vllm_models[is_chat].model_validate(body)  # a value vLLM accepts, so refusing it is our choice
    with pytest.raises(APIError) as err:
        conv.parse_request(body, is_chat)
    assert err.value.status == 400 and err.value.param == name and name in err.value.message


@pytest.mark.parametrize("is_chat, name", _cases(fp.Refused))
def test_refused_fields_at_vllms_default_are_accepted(vllm_models, is_chat, name):
    policy = TABLES[is_chat][name]
    assert isinstance(policy, fp.Refused)
    field = vllm_models[is_chat].model_fields[name]
    if field.default_factory is None:
        assert policy.default == field.default, "the table's default is not vLLM's"
    conv.parse_request({**BASE[is_chat], name: policy.default}, is_chat)
    with_none = {**BASE[is_chat], name: None}
    try:
        vllm_models[is_chat].model_validate(with_none)
    except ValueError:
        return  # vLLM rejects null here too
    conv.parse_request(with_none, is_chat)


@pytest.mark.parametrize("is_chat, name", _cases(fp.Ignored))
def test_ignored_fields_are_accepted(vllm_models, is_chat, name):
    default = vllm_models[is_chat].model_fields[name].default
    conv.parse_request({**BASE[is_chat], name: default}, is_chat)


@pytest.mark.parametrize("is_chat", [True, False], ids=["chat", "completions"])
def test_unknown_fields_stay_ignored(is_chat):
    req = conv.parse_request({**BASE[is_chat], "x_vendor_extra": {"a": 1}}, is_chat)
    assert not hasattr(req, "x_vendor_extra")


def test_response_format_text_is_not_a_use():
    conv.parse_request({**BASE[True], "response_format": {"type": "text"}}, True)
    conv.parse_request({**BASE[True], "tool_choice": "none"}, True)
