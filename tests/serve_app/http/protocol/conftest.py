"""The tiny checkpoint's tokenizer, ours and vLLM's (the protocol tests compare with vLLM)."""

from __future__ import annotations

import pytest

from accel.text.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return load_tokenizer(str(tiny_llama))


@pytest.fixture(scope="module")
def vllm_tok(tiny_llama):
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(str(tiny_llama))
