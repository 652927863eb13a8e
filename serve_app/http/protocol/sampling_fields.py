"""Request fields shared by /v1/completions and /v1/chat/completions (vLLM's spellings)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from accel.envs import ENVS
from serve_app.http.protocol.common import OpenAIBaseModel, StreamOptions


class SamplingFields(OpenAIBaseModel):
    model: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    n: int = 1
    seed: int | None = None
    # vLLM's StopParam: at most VLLM_MAX_STOP_STRINGS (4) strings
    stop: str | Annotated[list[str], Field(max_length=ENVS.max_stop_strings)] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    prompt_cache_key: str | None = None  # OpenAI's cache-routing key (a session key for the router)
    # vLLM extensions
    use_beam_search: bool = False
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = Field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    prompt_logprobs: int | None = None  # vLLM pools only (engine_support refuses others)
    cache_salt: str | None = None  # checked as vLLM checks it (conversion.check_cache_salt)
    request_id: str | None = None  # the response id's suffix (vLLM: random uuid when absent)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    # Constrained decoding (serve_app/http/protocol/structured_outputs.py; vLLM accepts all four on both
    # endpoints): validated into the contract's StructuredOutputSpec / SamplingParams fields.
    structured_outputs: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] = Field(default_factory=list)
    # Our extension (also accepted as the x-session-id header): a key the router keeps together.
    session_id: str | None = None
