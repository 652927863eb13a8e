"""The output length a client asked for (one reading) and vLLM 0.32's context rule, directly;
their use in ``sampling_params`` (against vLLM's own request models) is in test_conversion.py."""

from __future__ import annotations

import pytest

from serve_app.http.protocol import conversion as conv
from serve_app.http.protocol.chat import ChatCompletionRequest
from serve_app.http.protocol.completions import CompletionRequest
from serve_app.http.protocol.errors import APIError
from serve_app.http.protocol.max_tokens import fit_max_tokens, max_tokens_or_default, requested_max_tokens

MESSAGES = [{"role": "user", "content": "x"}]


def test_one_reading_of_the_requested_length():
    chat = conv.parse_body(ChatCompletionRequest, {"model": "m", "messages": MESSAGES, "max_tokens": 5})
    assert requested_max_tokens(chat) == ("max_tokens", 5)
    both = conv.parse_body(
        ChatCompletionRequest, {"model": "m", "messages": MESSAGES, "max_tokens": 5, "max_completion_tokens": 9}
    )
    assert requested_max_tokens(both) == ("max_completion_tokens", 9)
    # Completions' model default (16) is not the client's: unset reads None, vLLM's default 16.
    unset = conv.parse_body(CompletionRequest, {"model": "m", "prompt": "hi"})
    assert requested_max_tokens(unset) == ("max_tokens", None) and max_tokens_or_default(unset) == ("max_tokens", 16)
    chat_unset = conv.parse_body(ChatCompletionRequest, {"model": "m", "messages": MESSAGES})
    assert max_tokens_or_default(chat_unset) == ("max_tokens", None)


def test_what_fits_the_context():
    assert fit_max_tokens(None, "max_tokens", 10, 512) == 502  # None: the rest of the context
    assert fit_max_tokens(600 - 100, "max_tokens", 100, 512) == 412  # clamped: finishes with length
    with pytest.raises(APIError) as err:
        fit_max_tokens(513, "max_completion_tokens", 1, 512)
    assert (err.value.status, err.value.param) == (400, "max_completion_tokens")
    with pytest.raises(APIError) as err:
        fit_max_tokens(1, "max_tokens", 513, 512)
    assert (err.value.status, err.value.param) == (400, "input_tokens")
    with pytest.raises(APIError) as err:
        fit_max_tokens(None, "max_tokens", 512, 512)  # no room left for one token
    assert err.value.param == "max_tokens"
