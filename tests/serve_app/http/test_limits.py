"""The ingress's request limits as pure checks: invalid Unicode, untrusted chat templates, the
character cap, n and max_tokens caps, fan-out against the concurrency bound."""

from __future__ import annotations

import pytest

from accel.contract import SamplingParams
from deployments.config.ingress import IngressConfig
from serve_app.http import limits
from serve_app.http.protocol import conversion as conv
from serve_app.http.protocol.errors import APIError


def _status(fn, *args) -> tuple[int, str | None, str]:
    with pytest.raises(APIError) as info:
        fn(*args)
    return info.value.status, info.value.param, info.value.message


def test_lone_surrogates_are_refused_naming_the_field():
    cfg = IngressConfig()
    assert _status(limits.check_body, {"prompt": "a\ud800b"}, False, cfg, 100)[:2] == (400, "prompt")
    msgs = [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]
    assert _status(limits.check_body, {"messages": msgs}, True, cfg, 100)[:2] == (400, "messages")
    assert _status(limits.check_body, {"stop": ["\ud83d"]}, False, cfg, 100)[:2] == (400, "stop")
    limits.check_body({"prompt": "héllo 😀 \u4e16"}, False, cfg, 100)  # real non-ASCII is fine


def test_client_chat_template_needs_trust():
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ messages }}"}
    status, param, message = _status(limits.check_body, body, True, IngressConfig(), 100)
    assert (status, param) == (400, "chat_template") and "--trust-request-chat-template" in message
    kwargs = {"messages": body["messages"], "chat_template_kwargs": {"chat_template": "x"}}
    assert _status(limits.check_body, kwargs, True, IngressConfig(), 100)[0] == 400
    limits.check_body(body, True, IngressConfig(trust_request_chat_template=True), 100)


def test_character_cap_before_tokenizing():
    cfg = IngressConfig(max_prompt_chars=10)
    assert _status(limits.check_body, {"prompt": ["12345", "678901"]}, False, cfg, 100)[:2] == (400, "prompt")
    limits.check_body({"prompt": ["12345", "67890"]}, False, cfg, 100)
    # Default: max_model_len x MAX_CHARS_PER_TOKEN.
    assert IngressConfig().prompt_char_cap(100) == 100 * 32
    msgs = [{"role": "user", "content": "x" * 3201}]
    assert _status(limits.check_body, {"messages": msgs}, True, IngressConfig(), 100)[:2] == (400, "messages")


def test_n_cap():
    assert _status(limits.check_n, 5, IngressConfig(max_n=4))[:2] == (400, "n")
    limits.check_n(4, IngressConfig(max_n=4))


def test_max_tokens_cap_refuses_larger_and_is_the_default():
    cfg = IngressConfig(max_tokens_cap=8)
    completion = conv.parse_request({"prompt": "a", "max_tokens": 9}, False)
    assert _status(limits.cap_max_tokens, [SamplingParams(max_tokens=9)], completion, cfg)[:2] == (400, "max_tokens")
    chat = conv.parse_request({"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 9}, True)
    assert _status(limits.cap_max_tokens, [SamplingParams(max_tokens=9)], chat, cfg)[1] == "max_completion_tokens"
    unasked = conv.parse_request({"prompt": "a"}, False)
    (sp,) = limits.cap_max_tokens([SamplingParams(max_tokens=100)], unasked, cfg)  # None asked: room = 100
    assert sp.max_tokens == 8
    (sp,) = limits.cap_max_tokens([SamplingParams(max_tokens=5)], unasked, cfg)  # room smaller: kept
    assert sp.max_tokens == 5


def test_fan_out_counts_each_engine_request():
    bound = limits.ConcurrencyBound(4)
    assert bound.try_acquire(1)
    bound.check_fan_out(2, retry_after_s=1)  # 3 in all
    assert bound.held == 3
    assert bound.try_acquire(1) and not bound.try_acquire(1)
    bound.release(4)
    assert bound.try_acquire(1)
    status, param, _ = _status(bound.check_fan_out, 4, 1)  # 5 could never fit in 4
    assert (status, param) == (400, "n")
    assert bound.try_acquire(2)
    with pytest.raises(APIError) as info:
        bound.check_fan_out(2, 3)  # 1 + 2 held, 2 more do not fit now
    assert info.value.status == 429 and info.value.retry_after_s == 3
    assert bound.held == 3
