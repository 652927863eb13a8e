"""Pieces shared by the completions and chat APIs: usage, stream options, model cards."""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class OpenAIBaseModel(BaseModel):
    # vLLM's server ignores fields it does not know; so do we (clients send vendor extras).
    model_config = ConfigDict(extra="ignore")


class StreamOptions(OpenAIBaseModel):
    # vLLM's defaults: a final usage chunk only when asked for; per-chunk usage only with it.
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class PromptTokenUsageInfo(OpenAIBaseModel):
    cached_tokens: int | None = None


class CompletionTokenUsageInfo(OpenAIBaseModel):
    reasoning_tokens: int = 0


class UsageInfo(OpenAIBaseModel):
    """vLLM's usage body (every field, ``completion_tokens_details`` null unless set, as there)."""

    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: PromptTokenUsageInfo | None = None
    completion_tokens_details: CompletionTokenUsageInfo | None = None


class ModelCard(OpenAIBaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "meshserve"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[dict[str, Any]] = Field(default_factory=list)


class ModelList(OpenAIBaseModel):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def make_usage(num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int) -> UsageInfo:
    return UsageInfo(
        prompt_tokens=num_prompt_tokens,
        completion_tokens=num_completion_tokens,
        total_tokens=num_prompt_tokens + num_completion_tokens,
        prompt_tokens_details=PromptTokenUsageInfo(cached_tokens=num_cached_tokens),
    )
