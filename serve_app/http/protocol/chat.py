"""``/v1/chat/completions`` request and response models (vLLM's field names and shapes)."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import Field

from serve_app.http.protocol.common import OpenAIBaseModel, UsageInfo, random_id
from serve_app.http.protocol.sampling_fields import SamplingFields


class ChatCompletionRequest(SamplingFields):
    messages: list[dict[str, Any]]
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    # Tools and reasoning: validated and applied through vLLM's own request model and parsers
    # (serve_app.http.protocol.tool_request / tool_output).
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = True
    chat_template_kwargs: dict[str, Any] | None = None
    include_reasoning: bool = True
    reasoning_effort: str | None = None
    documents: list[dict[str, str]] | None = None  # a chat template variable (RAG templates)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    echo: bool = False  # prepend the continued last message's content (vLLM)
    add_special_tokens: bool = False  # on top of what the template adds (vLLM's chat default)
    chat_template: str | None = None


class ChatMessage(OpenAIBaseModel):
    role: str
    content: str | None = None
    reasoning: str | None = None  # vLLM 0.32's name
    reasoning_content: str | None = None  # the same text, under earlier vLLM's / DeepSeek's name
    tool_calls: list[dict[str, Any]] | None = None


class ChatCompletionLogProb(OpenAIBaseModel):
    token: str
    logprob: float = -9999.0
    bytes: list[int] | None = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb] = Field(default_factory=list)


class ChatCompletionLogProbs(OpenAIBaseModel):
    content: list[ChatCompletionLogProbsContent] | None = None


class ChatCompletionResponseChoice(OpenAIBaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: random_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    system_fingerprint: str | None = None
    usage: UsageInfo
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None
    prompt_token_ids: list[int] | None = None


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChatCompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionStreamResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = None
