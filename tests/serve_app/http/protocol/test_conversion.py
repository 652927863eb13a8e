"""HTTP request models -> engine requests: defaults, vLLM extensions, 400s naming the field."""

from __future__ import annotations

import pytest

from accel.contract import InvalidRequestError
from accel.text.tokenizer import load_tokenizer
from serve_app.http.protocol import conversion as conv
from serve_app.http.protocol.chat import ChatCompletionRequest
from serve_app.http.protocol.completions import CompletionRequest
from serve_app.http.protocol.errors import APIError
from serve_app.http.protocol.max_tokens import echo_only


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return load_tokenizer(str(tiny_llama))


def _completion(**kw) -> CompletionRequest:
    return conv.parse_body(CompletionRequest, {"model": "m", "prompt": "hello", **kw})


def test_every_vllm_extension_reaches_sampling_params(tok):
    req = _completion(
        temperature=0.5,
        top_p=0.9,
        top_k=5,
        min_p=0.1,
        seed=7,
        max_tokens=12,
        min_tokens=2,
        stop=["x", "y"],
        stop_token_ids=[3],
        include_stop_str_in_output=True,
        ignore_eos=True,
        logprobs=3,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.2,
        logit_bias={"5": -100},
        skip_special_tokens=False,
    )
    sp = conv.sampling_params(req, 4, 512)
    assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.seed) == (0.5, 0.9, 5, 0.1, 7)
    assert (sp.max_tokens, sp.min_tokens, sp.stop, sp.stop_token_ids) == (12, 2, ("x", "y"), (3,))
    assert sp.include_stop_str_in_output and sp.ignore_eos and not sp.skip_special_tokens
    assert (sp.logprobs, sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty) == (3, 0.5, -0.5, 1.2)
    assert sp.logit_bias == ((5, -100.0),)


def test_defaults_follow_vllm(tok):
    sp = conv.sampling_params(_completion(), 4, 512)
    assert (sp.temperature, sp.top_p, sp.top_k, sp.max_tokens, sp.logprobs) == (1.0, 1.0, 0, 16, None)
    chat = conv.parse_body(ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert conv.sampling_params(chat, 10, 512).max_tokens == 502  # None: up to max_model_len


def test_max_completion_tokens_wins_over_max_tokens():
    chat = conv.parse_body(
        ChatCompletionRequest,
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 5,
            "max_completion_tokens": 9,
            "logprobs": True,
            "top_logprobs": 2,
        },
    )
    sp = conv.sampling_params(chat, 3, 512)
    assert sp.max_tokens == 9 and sp.logprobs == 2


def test_prompt_forms(tok):
    assert conv.completion_prompts(_completion(prompt="hello"), tok) == [tuple(tok.encode("hello"))]
    assert conv.completion_prompts(_completion(prompt=[5, 6, 7]), tok) == [(5, 6, 7)]
    assert conv.completion_prompts(_completion(prompt=[[5], [6, 7]]), tok) == [(5,), (6, 7)]
    assert len(conv.completion_prompts(_completion(prompt=["a", "b"]), tok)) == 2
    no_bos = conv.completion_prompts(_completion(prompt="hello", add_special_tokens=False), tok)[0]
    assert no_bos == tuple(tok.encode("hello", add_special_tokens=False))


def test_chat_prompt_uses_the_template(tok):
    req = conv.parse_body(
        ChatCompletionRequest,
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
    )
    ids = conv.chat_prompt(req, tok)
    assert list(ids) == tok.apply_chat_template([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(
    "body, param",
    [
        ({"temperature": "hot"}, "temperature"),
        ({"n": 0}, "n"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": [5000]}, "prompt"),
        ({"echo": True, "logprobs": 1}, "echo"),
        ({"suffix": "x"}, "suffix"),
        ({"use_beam_search": True}, "use_beam_search"),
        ({"max_tokens": 600}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"prompt": "x " * 600}, "input_tokens"),
    ],
)
def test_bad_completion_params_name_the_field(tok, body, param):
    with pytest.raises(APIError) as err:
        req = _completion(**body)
        for ids in conv.completion_prompts(req, tok):
            conv.sampling_params(req, len(ids), 512)
    assert err.value.status == 400 and err.value.param == param


@pytest.mark.parametrize(
    "body, field",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"logprobs": 50}, "logprobs"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"logit_bias": {"-1": 5}}, "logit_bias"),
        ({"min_tokens": 20, "max_tokens": 5}, "min_tokens"),
    ],
)
def test_out_of_range_values_are_invalid_request_errors(body, field):
    with pytest.raises(InvalidRequestError) as err:
        conv.sampling_params(_completion(**body), 3, 512)
    assert err.value.field == field


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_bad_chat_params(tok, body, param):
    full = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    with pytest.raises(APIError) as err:
        conv.chat_prompt(conv.parse_body(ChatCompletionRequest, full), tok)
    assert err.value.param == param


@pytest.mark.parametrize("role", ["user", "system", "developer", "assistant", "tool", "function", "custom"])
def test_null_content_refused_for_exactly_the_roles_vllm_refuses(tok, role):
    from pydantic import ValidationError
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmChat

    message = {"role": role, "content": None, "tool_call_id": "c1", "name": "f"}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}, message]}
    try:
        VllmChat.model_validate(body)
        vllm_accepts = True
    except ValidationError:
        vllm_accepts = False
    assert vllm_accepts == (role in ("assistant", "function"))  # the table this test holds us to
    if vllm_accepts:
        assert conv.chat_prompt(conv.parse_body(ChatCompletionRequest, body), tok)
        return
    with pytest.raises(APIError) as err:
        conv.chat_prompt(conv.parse_body(ChatCompletionRequest, body), tok)
    assert err.value.status == 400 and err.value.param == "messages"


def test_echo_with_max_tokens_0_generates_one_token_as_vllm():
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest as VllmCompletion

    req = _completion(echo=True, max_tokens=0)
    assert echo_only(req) and conv.sampling_params(req, 3, 512).max_tokens == 1
    vllm_req = VllmCompletion.model_validate({"model": "m", "prompt": "hello", "echo": True, "max_tokens": 0})
    assert vllm_req.to_sampling_params(512).max_tokens == 1
    plain = _completion(max_tokens=0)
    assert not echo_only(plain)
    with pytest.raises(APIError) as err:
        conv.sampling_params(plain, 3, 512)
    assert err.value.param == "max_tokens"


def test_n_fans_out_with_choice_indexes():
    sp = conv.sampling_params(_completion(), 2, 512)
    reqs = conv.generate_requests("cmpl-x", [(1, 2), (3,)], [sp, sp], 2, "s1")
    assert [r.request_id for r in reqs] == ["cmpl-x-0", "cmpl-x-1", "cmpl-x-2", "cmpl-x-3"]
    assert [r.prompt_token_ids for r in reqs] == [(1, 2), (1, 2), (3,), (3,)]
    assert all(r.session_id == "s1" for r in reqs)
