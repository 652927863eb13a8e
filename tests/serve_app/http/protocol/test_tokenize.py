"""/tokenize and /detokenize: vLLM's request and response shapes (its installed models are the
reference), the same ids a generation request would send, and a round trip."""

from __future__ import annotations

import pytest

from accel.text.tokenizer import load_tokenizer
from serve_app.http.protocol import conversion as conv
from serve_app.http.protocol import tokenize as tk
from serve_app.http.protocol.errors import APIError

MSGS = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return load_tokenizer(str(tiny_llama))


def test_completion_form_round_trips(tok):
    out = tk.tokenize(tk.TokenizeCompletionRequest(prompt="Hello world", return_token_strs=True), tok, 512)
    assert out.tokens == tok.encode("Hello world") and out.count == len(out.tokens) and out.max_model_len == 512
    assert out.token_strs == tok.hf.convert_ids_to_tokens(out.tokens)
    back = tk.detokenize(tk.DetokenizeRequest(tokens=out.tokens), tok)
    assert back.prompt == tok.hf.decode(out.tokens)  # vLLM decodes with the tokenizer's defaults


def test_chat_form_equals_the_chat_completion_prompt(tok):
    req = conv.parse_body(tk.TokenizeChatRequest, {"messages": MSGS})
    chat = conv.parse_request({"model": "m", "messages": MSGS}, True)
    assert tuple(tk.tokenize(req, tok, 512).tokens) == conv.chat_prompt(chat, tok)


def test_detokenize_out_of_vocab_is_a_400(tok):
    with pytest.raises(APIError) as err:
        tk.detokenize(tk.DetokenizeRequest(tokens=[tok.vocab_size]), tok)
    assert err.value.param == "tokens"


def test_shapes_follow_vllm():
    from vllm.entrypoints.serve.tokenize import protocol as vp

    for ours, theirs in [
        (tk.TokenizeResponse, vp.TokenizeResponse),
        (tk.DetokenizeResponse, vp.DetokenizeResponse),
        (tk.TokenizeCompletionRequest, vp.TokenizeCompletionRequest),
        (tk.DetokenizeRequest, vp.DetokenizeRequest),
    ]:
        assert set(ours.model_fields) == set(theirs.model_fields), ours.__name__
    refused = {"tools", "chat_template_kwargs", "media_io_kwargs", "mm_processor_kwargs"}
    assert set(tk.TokenizeChatRequest.model_fields) | refused == set(vp.TokenizeChatRequest.model_fields)
    for name, field in tk.TokenizeChatRequest.model_fields.items():
        assert field.default == vp.TokenizeChatRequest.model_fields[name].default, name
