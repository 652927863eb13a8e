"""vLLM 0.32's request semantics field by field: seed + index for n > 1, the max_tokens clamp,
continue_final_message, stream_options, request ids, truncation, return_tokens_as_token_ids."""

from __future__ import annotations

import pytest

from accel.contract import OutputDelta, TokenLogprob
from accel.text.tokenizer import load_tokenizer
from serve_app.http.protocol import conversion as conv
from serve_app.http.protocol import responses as rsp
from serve_app.http.protocol.errors import APIError

MSGS = [{"role": "user", "content": "Say hi"}]


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return load_tokenizer(str(tiny_llama))


def _chat(**kw):
    return conv.parse_request({"model": "m", "messages": MSGS, **kw}, True)


def _completion(**kw):
    return conv.parse_request({"model": "m", "prompt": "hello", **kw}, False)


def test_seeded_choices_get_seed_plus_index():
    req = _completion(n=3, seed=7)
    sp = conv.sampling_params(req, 2, 512)
    reqs = conv.generate_requests("cmpl-x", [(1, 2), (3,)], [sp, sp], 3, None)
    assert [r.sampling.seed for r in reqs] == [7, 8, 9, 7, 8, 9]
    unseeded = conv.sampling_params(_completion(n=2), 2, 512)
    assert [r.sampling.seed for r in conv.generate_requests("c", [(1,)], [unseeded], 2, None)] == [None, None]


@pytest.mark.parametrize(
    "body, n_prompt, expected",
    [
        ({"max_tokens": 100}, 500, 12),  # clamped to what fits: finishes with "length"
        ({}, 500, 12),  # completions default 16, clamped
        ({"max_tokens": None}, 10, 16),  # explicit null is the default, as vLLM's normalize_null_max_tokens
        ({"max_tokens": 512}, 1, 511),
    ],
)
def test_completion_max_tokens_clamp(body, n_prompt, expected):
    assert conv.sampling_params(_completion(**body), n_prompt, 512).max_tokens == expected


def test_chat_max_tokens_clamp():
    assert conv.sampling_params(_chat(), 500, 512).max_tokens == 12  # None: all that fits
    assert conv.sampling_params(_chat(max_completion_tokens=50), 500, 512).max_tokens == 12
    assert conv.sampling_params(_chat(max_tokens=50), 10, 512).max_tokens == 50


@pytest.mark.parametrize(
    "body, n_prompt, param, text",
    [
        ({"max_tokens": 513}, 4, "max_tokens", "max_tokens=513 cannot be greater than max_model_len=512"),
        ({}, 513, "input_tokens", "your prompt contains 513 input tokens"),
        ({}, 512, "max_tokens", "at least 1, got 0"),  # a full context leaves no room (vLLM: max_tokens 0)
        ({"max_tokens": 0}, 4, "max_tokens", "at least 1, got 0"),
    ],
)
def test_max_tokens_errors_as_vllm(body, n_prompt, param, text):
    with pytest.raises(APIError) as err:
        conv.sampling_params(_completion(**body), n_prompt, 512)
    assert err.value.status == 400 and err.value.param == param and text in err.value.message


def test_continue_final_message_leaves_the_turn_open(tok):
    msgs = [*MSGS, {"role": "assistant", "content": "Hello the"}]
    open_ids = conv.chat_prompt(_chat(messages=msgs, continue_final_message=True, add_generation_prompt=False), tok)
    hf_text = tok.hf.apply_chat_template(msgs, tokenize=False, continue_final_message=True)
    assert list(open_ids) == tok.encode(hf_text, add_special_tokens=False)
    assert tok.decode(open_ids, skip_special_tokens=False).endswith("Hello the")
    closed = conv.chat_prompt(_chat(messages=msgs, add_generation_prompt=False), tok)
    assert len(closed) > len(open_ids)


@pytest.mark.parametrize(
    "body", [{"continue_final_message": True, "add_generation_prompt": True}, {"continue_final_message": True}]
)
def test_continue_final_message_with_generation_prompt_is_a_400(tok, body):
    msgs = [*MSGS, {"role": "assistant", "content": "Hello"}]
    with pytest.raises(APIError) as err:
        conv.chat_prompt(_chat(messages=msgs, **body), tok)
    assert err.value.status == 400 and err.value.param == "continue_final_message"


def test_chat_add_special_tokens_adds_bos_on_top(tok):
    plain = conv.chat_prompt(_chat(), tok)
    extra = conv.chat_prompt(_chat(add_special_tokens=True), tok)
    assert list(extra) == tok.encode(tok.decode(plain, skip_special_tokens=False), add_special_tokens=True)


def test_stream_options_need_stream():
    with pytest.raises(APIError) as err:
        _completion(stream_options={"include_usage": True})
    assert err.value.param == "stream_options"
    assert _completion(stream=True, stream_options={}).stream_options.include_usage is False  # vLLM's default


def test_request_id_field_then_header_then_random():
    assert conv.response_id("cmpl", "hdr-1", _completion(request_id="body-1")) == "cmpl-body-1"
    assert conv.response_id("cmpl", "hdr-1", _completion()) == "cmpl-hdr-1"
    assert conv.response_id("chatcmpl", None, _chat(request_id="body-1")) == "chatcmpl-body-1"
    a, b = conv.response_id("cmpl", None, _completion()), conv.response_id("cmpl", None, _completion())
    assert a.startswith("cmpl-") and a != b


@pytest.mark.parametrize(
    "body, expected",
    [
        ({"truncate_prompt_tokens": 3, "truncation_side": "left"}, (4, 5, 6)),
        ({"truncate_prompt_tokens": 3, "truncation_side": "right"}, (1, 2, 3)),
        ({"truncate_prompt_tokens": 10}, (1, 2, 3, 4, 5, 6)),
    ],
)
def test_truncate_prompt_tokens(tok, body, expected):
    assert conv.request_prompts(_completion(prompt=[1, 2, 3, 4, 5, 6], **body), tok, 512) == [expected]


def test_truncate_minus_one_keeps_room_for_output(tok):
    ids = list(range(1, 20))
    (kept,) = conv.request_prompts(_completion(prompt=ids, truncate_prompt_tokens=-1, truncation_side="left"), tok, 8)
    assert kept == tuple(ids[-7:])
    with pytest.raises(APIError) as err:
        conv.request_prompts(_completion(prompt=ids, truncate_prompt_tokens=9), tok, 8)
    assert err.value.param == "truncate_prompt_tokens"


def test_echo_texts_as_vllm(tok):
    assert conv.echo_texts(_completion(), tok) == ()
    assert conv.echo_texts(_completion(prompt=["ab", "cd"], echo=True), tok) == ("ab", "cd")
    ids = tok.encode("hello")
    assert conv.echo_texts(_completion(prompt=ids, echo=True), tok) == (tok.decode(ids, skip_special_tokens=False),)
    assert conv.echo_texts(_completion(prompt="ab", echo=True, return_token_ids=True), tok) == ("",)
    msgs = [*MSGS, {"role": "assistant", "content": "Hi the"}]
    cont = _chat(messages=msgs, echo=True, continue_final_message=True, add_generation_prompt=False)
    assert conv.echo_texts(cont, tok) == ("Hi the",)
    assert conv.echo_texts(_chat(echo=True), tok) == ("",)  # a new assistant turn: nothing to echo
    opts = rsp.RenderOptions("c", 1, "m", None, False, False, echo=("Hi the",))
    c = rsp.ChoiceState(index=0, prompt_index=0, text="re")
    assert rsp.chat_response(opts, tok, [c], (1,)).choices[0].message.content == "Hi there"
    assert rsp.completion_response(opts, tok, [c], [(1,)]).choices[0].text == "Hi there"


def test_continuous_usage_and_tokens_as_ids(tok):
    opts = rsp.RenderOptions(
        request_id="cmpl-1",
        created=1,
        model="m",
        num_logprobs=2,
        return_token_ids=False,
        include_usage=True,
        continuous_usage=True,
        num_prompt_tokens=4,
        tokens_as_ids=True,
    )
    assert not opts.is_text_only
    delta = OutputDelta(
        request_id="r",
        new_token_ids=(5,),
        text="x",
        num_prompt_tokens=4,
        num_completion_tokens=3,
        logprobs=(TokenLogprob(token_id=5, logprob=-0.5, top=((5, -0.5), (9, -1.0))),),
    )
    choice = rsp.ChoiceState(index=0, prompt_index=0)
    chunk = rsp.completion_chunk(opts, tok, choice, delta, 0)
    assert (chunk.usage.prompt_tokens, chunk.usage.completion_tokens, chunk.usage.total_tokens) == (4, 3, 7)
    assert chunk.choices[0].logprobs.tokens == ["token_id:5"]
    assert chunk.choices[0].logprobs.top_logprobs == [{"token_id:5": -0.5, "token_id:9": -1.0}]
    chat = rsp.chat_chunk(opts, tok, choice, delta)
    assert chat.usage.completion_tokens == 3 and chat.choices[0].logprobs.content[0].token == "token_id:5"
    assert rsp.chat_role_chunk(opts, 0).usage.prompt_tokens == 4


def test_prompt_logprobs_in_vllms_shape(tok):
    with pytest.raises(APIError) as err:
        _completion(prompt_logprobs=1, stream=True)
    assert err.value.param == "prompt_logprobs"
    assert conv.sampling_params(_completion(prompt_logprobs=2), 2, 512).prompt_logprobs == 2
    lps = (None, TokenLogprob(token_id=7, logprob=-1.5, top=((9, -0.5),), rank=3))
    (first, second) = rsp.prompt_logprobs_json(tok, lps)
    assert first is None and second["7"]["rank"] == 3 and second["7"]["logprob"] == -1.5
    assert second["9"] == {"logprob": -0.5, "rank": 1, "decoded_token": tok.decode([9], skip_special_tokens=False)}
    opts = rsp.RenderOptions("c", 1, "m", None, False, False)
    c = rsp.ChoiceState(index=0, prompt_index=0)
    c.add(OutputDelta("r", (), "", 2, 0, prompt_logprobs=lps))
    assert rsp.completion_response(opts, tok, [c], [(1, 7)]).choices[0].prompt_logprobs[1]["7"]["rank"] == 3
    assert rsp.chat_response(opts, tok, [c], (1, 7)).prompt_logprobs[0] is None
