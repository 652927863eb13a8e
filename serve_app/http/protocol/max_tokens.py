"""The output length a client asked for, read once, and vLLM 0.32's rule for what fits the
context (``TokenizeParams`` + ``get_max_tokens``)."""

from __future__ import annotations

from serve_app.http.protocol.chat import ChatCompletionRequest
from serve_app.http.protocol.completions import CompletionRequest
from serve_app.http.protocol.errors import APIError, bad_request


def fit_max_tokens(requested: int | None, param: str, num_prompt_tokens: int, max_model_len: int) -> int:
    """vLLM 0.32's rule (``TokenizeParams`` + ``get_max_tokens``): more output tokens than
    max_model_len, or a prompt longer than max_model_len, is a 400; otherwise max_tokens is
    clamped to what fits (the request then finishes with ``length``), and None means all of it."""
    if requested is not None and requested > max_model_len:
        raise bad_request(
            f"{param}={requested} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            param,
        )
    if num_prompt_tokens > max_model_len:
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
            f"contains {num_prompt_tokens} input tokens, which exceeds this limit even without any "
            "output tokens. Please reduce the length of the input prompt.",
            "input_tokens",
        )
    room = max_model_len - num_prompt_tokens
    max_tokens = room if requested is None else min(room, requested)
    if max_tokens < 1:
        raise bad_request(f"{param} must be at least 1, got {max_tokens}.", param)
    return max_tokens


def echo_only(req: CompletionRequest | ChatCompletionRequest) -> bool:
    """A completion with ``echo`` and ``max_tokens: 0``: vLLM's "echo without generation" (the
    prompt as the text; one token is generated and counted in usage and ``token_ids``)."""
    return isinstance(req, CompletionRequest) and bool(req.echo) and req.max_tokens == 0


def requested_max_tokens(req: CompletionRequest | ChatCompletionRequest) -> tuple[str, int | None]:
    """The one reading of the client's completion length: (the field that set it, its value;
    None = the client sent none). ``max_completion_tokens`` wins over ``max_tokens`` on chat."""
    if isinstance(req, ChatCompletionRequest):
        if req.max_completion_tokens is not None:
            return "max_completion_tokens", req.max_completion_tokens
        return "max_tokens", req.max_tokens
    # Completions' model defaults max_tokens to 16: only a value the client sent counts here.
    return "max_tokens", req.max_tokens if "max_tokens" in req.model_fields_set else None


def max_tokens_or_default(req: CompletionRequest | ChatCompletionRequest) -> tuple[str, int | None]:
    """``requested_max_tokens`` with vLLM's defaults: on completions an explicit null is 16; on
    chat None stays None (up to max_model_len)."""
    field, requested = requested_max_tokens(req)
    if requested is None and isinstance(req, CompletionRequest):
        return field, 16
    return field, requested
