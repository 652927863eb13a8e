"""``bad_words`` token sequences equal vLLM 0.32's ``SamplingParams.update_from_tokenizer``."""

from __future__ import annotations

import pytest

from accel.contract import InvalidRequestError
from accel.text.bad_words import bad_words_token_ids
from accel.text.tokenizer import load_tokenizer


@pytest.mark.parametrize("ckpt", ["tiny_llama", "tiny_qwen3"])
def test_same_sequences_as_vllm(ckpt, request):
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.tokenizers.registry import get_tokenizer

    path = str(request.getfixturevalue(ckpt))
    tok = load_tokenizer(path)
    words = ["hello", " world", "def main", "x", "hello", "Ünïcode"]
    sp = VllmSamplingParams(bad_words=words)
    sp.update_from_tokenizer(get_tokenizer(path))  # the tokenizer vLLM's engine uses
    assert bad_words_token_ids(words, tok) == tuple(tuple(s) for s in sp._bad_words_token_ids)


def test_empty_word_is_refused(tiny_llama):
    tok = load_tokenizer(str(tiny_llama))
    with pytest.raises(InvalidRequestError) as err:
        bad_words_token_ids(["ok", ""], tok)
    assert err.value.field == "bad_words"
