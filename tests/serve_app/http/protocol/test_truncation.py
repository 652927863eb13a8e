"""``truncate_prompt_tokens`` / ``truncation_side`` against vLLM 0.32's own ``TokenizeParams``
with vLLM's tokenizer of the same checkpoint: text prompts (completions, rendered chats) and
token-id prompts, every side, with and without special tokens."""

from __future__ import annotations

import pytest
from vllm.renderers.params import TokenizeParams

from serve_app.http.protocol import conversion as conv
from serve_app.http.protocol.errors import APIError

MAX_MODEL_LEN = 512
TEXT = "Hello world how are you doing today, my friend?"


def _vllm(vllm_tok, prompt, keep, side, add_special_tokens=True, max_tokens=16):
    params = TokenizeParams(
        max_total_tokens=MAX_MODEL_LEN,
        max_output_tokens=max_tokens,
        truncate_prompt_tokens=keep,
        truncation_side=side,
        add_special_tokens=add_special_tokens,
    )
    ids = vllm_tok.encode(prompt, **params.get_encode_kwargs()) if isinstance(prompt, str) else list(prompt)
    return tuple(params.apply_post_tokenization(vllm_tok, {"prompt_token_ids": ids})["prompt_token_ids"])


@pytest.mark.parametrize("side", [None, "left", "right"])
@pytest.mark.parametrize("keep", [1, 2, 3, 7, 200])
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_completions_text_prompt_as_vllm(tok, vllm_tok, side, keep, add_special_tokens):
    body = {"prompt": TEXT, "truncate_prompt_tokens": keep, "add_special_tokens": add_special_tokens}
    if side is not None:
        body["truncation_side"] = side
    (ours,) = conv.request_prompts(conv.parse_request({"model": "m", **body}, False), tok, MAX_MODEL_LEN)
    assert ours == _vllm(vllm_tok, TEXT, keep, side, add_special_tokens)


def test_default_keeps_the_bos_and_the_texts_end(tok):
    # The case a client hits first: vLLM keeps <bos> + the last tokens, not the first ones.
    full = tuple(tok.encode(TEXT))
    (ours,) = conv.request_prompts(conv.parse_request({"prompt": TEXT, "truncate_prompt_tokens": 3}, False), tok, 512)
    assert ours == (full[0], *full[-2:])


@pytest.mark.parametrize("side", [None, "left", "right"])
@pytest.mark.parametrize("keep", [2, 5, -1])
def test_token_prompt_as_vllm(tok, vllm_tok, side, keep):
    ids = list(range(3, 600))
    body = {"prompt": ids, "truncate_prompt_tokens": keep, "max_tokens": 16}
    if side is not None:
        body["truncation_side"] = side
    (ours,) = conv.request_prompts(conv.parse_request(body, False), tok, MAX_MODEL_LEN)
    assert ours == _vllm(vllm_tok, ids, keep, side)


@pytest.mark.parametrize("side", [None, "left", "right"])
def test_chat_prompt_as_vllm(tok, vllm_tok, side):
    messages = [{"role": "user", "content": TEXT}]
    body = {"messages": messages, "truncate_prompt_tokens": 6}
    if side is not None:
        body["truncation_side"] = side
    (ours,) = conv.request_prompts(conv.parse_request(body, True), tok, MAX_MODEL_LEN)
    rendered = vllm_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours == _vllm(vllm_tok, rendered, 6, side, add_special_tokens=False)


def test_more_than_the_context_is_a_400_naming_the_field(tok):
    with pytest.raises(APIError) as err:
        conv.request_prompts(conv.parse_request({"prompt": TEXT, "truncate_prompt_tokens": 513}, False), tok, 512)
    assert err.value.status == 400 and err.value.param == "truncate_prompt_tokens"
