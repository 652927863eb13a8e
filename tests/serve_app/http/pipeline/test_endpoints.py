"""Endpoints parse their own body into a completion or chat request; Responses converts its body
to the chat body the shared stages (and the limits) read, and keeps its call to render with."""

from __future__ import annotations

from serve_app.http.pipeline.endpoints import CHAT, COMPLETIONS, RESPONSES
from serve_app.http.protocol.chat import ChatCompletionRequest
from serve_app.http.protocol.completions import CompletionRequest
from serve_app.http.protocol.responses_api import ResponsesCall


def test_completions_and_chat_read_their_request_models():
    completion = COMPLETIONS.read({"model": "m", "prompt": "hi", "n": 2})
    assert isinstance(completion.request, CompletionRequest) and completion.request.n == 2
    assert completion.state is None and COMPLETIONS.id_prefix == "cmpl"
    chat = CHAT.read({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert isinstance(chat.request, ChatCompletionRequest) and CHAT.id_prefix == "chatcmpl"


def test_responses_reads_as_a_chat_request_and_keeps_its_call():
    body = {"model": "m", "input": "Say hello", "instructions": "Be brief.", "max_output_tokens": 7}
    read = RESPONSES.read(body)
    assert isinstance(read.request, ChatCompletionRequest) and isinstance(read.state, ResponsesCall)
    assert read.body is read.state.chat_body and "messages" in read.body  # what the limits read
    system, user = {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}
    assert read.body["messages"] == [system, user]
    assert read.request.max_completion_tokens == 7  # max_output_tokens, owned by the sampling stage
