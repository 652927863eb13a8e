"""Sampling fields accepted or refused exactly where vLLM 0.32's server accepts or refuses them:
its own request models and ``to_sampling_params`` (``SamplingParams`` validation) decide, on
both endpoints, and a refusal here is a 400 naming the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmChat
from vllm.entrypoints.openai.completion.protocol import CompletionRequest as VllmCompletion
from vllm.exceptions import VLLMValidationError

from accel.contract import InvalidRequestError
from serve_app.http.protocol import conversion as conv
from serve_app.http.protocol.errors import APIError

CASES = [
    ({"temperature": 2.0}, None),
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": 1000}, "temperature"),
    ({"repetition_penalty": 3.0}, None),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"stop": ""}, "stop"),
    ({"stop": ["a", ""]}, "stop"),
    ({"stop": ["a", "b", "c", "d"]}, None),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"n": 2, "temperature": 0}, "n"),
    ({"n": 2, "temperature": 0.5}, None),
    ({"n": 2}, None),
    ({"logit_bias": {"5": 1e9}}, None),  # clamped to 100
    ({"logit_bias": {"5": "high"}}, "logit_bias"),
]


def _vllm_accepts(body: dict, is_chat: bool) -> bool:
    try:
        if is_chat:
            VllmChat.model_validate(body).to_sampling_params(16, {})
        else:
            VllmCompletion.model_validate(body).to_sampling_params(16)
    except (ValidationError, VLLMValidationError, ValueError):
        return False
    return True


def _ours(body: dict, is_chat: bool):
    req = conv.parse_request(body, is_chat)
    conv._check_common(req)
    return conv.sampling_params(req, 4, 512)


@pytest.mark.parametrize("is_chat", [False, True])
@pytest.mark.parametrize("fields, refused", CASES)
def test_accepted_and_refused_where_vllm_does(fields, refused, is_chat):
    prompt = {"messages": [{"role": "user", "content": "hi"}]} if is_chat else {"prompt": "hi"}
    body = {"model": "m", **prompt, **fields}
    assert _vllm_accepts(body, is_chat) == (refused is None)
    if refused is None:
        _ours(body, is_chat)
        return
    with pytest.raises((APIError, InvalidRequestError)) as err:
        _ours(body, is_chat)
    param = err.value.param if isinstance(err.value, APIError) else err.value.field
    assert param == refused
