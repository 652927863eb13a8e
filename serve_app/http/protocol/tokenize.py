"""``/tokenize`` and ``/detokenize`` (vLLM's ``vllm/entrypoints/serve/tokenize``): request and
response models, and the rendering they do — the same chat template and tokenizer as a
generation request, so ``/tokenize`` returns exactly the ids a chat or completions request with
the same fields would send to an engine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field

from accel.text.tokenizer import TextTokenizer
from serve_app.http.protocol.common import OpenAIBaseModel
from serve_app.http.protocol.conversion import render_chat
from serve_app.http.protocol.errors import bad_request


class TokenizeCompletionRequest(OpenAIBaseModel):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(OpenAIBaseModel):
    model: str | None = None
    messages: list[dict[str, Any]]
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0, le=2**63 - 1)]]


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str


def is_chat_body(body: Mapping[str, Any]) -> bool:
    """vLLM's ``TokenizeRequest`` is a union: a body with ``messages`` is the chat form."""
    return "messages" in body


def tokenize(
    req: TokenizeCompletionRequest | TokenizeChatRequest, tok: TextTokenizer, max_model_len: int
) -> TokenizeResponse:
    if isinstance(req, TokenizeChatRequest):
        ids = list(
            render_chat(
                req.messages,
                tok,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                chat_template=req.chat_template,
                add_special_tokens=req.add_special_tokens,
            )
        )
    else:
        ids = tok.encode(req.prompt, add_special_tokens=req.add_special_tokens)
    strs = tok.hf.convert_ids_to_tokens(ids) if req.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=max_model_len, tokens=ids, token_strs=strs)


def detokenize(req: DetokenizeRequest, tok: TextTokenizer) -> DetokenizeResponse:
    if any(t >= tok.vocab_size for t in req.tokens):
        raise bad_request(f"token ids must be < vocab size {tok.vocab_size}", "tokens")
    # vLLM's renderer decodes the prompt with the tokenizer's defaults: special tokens kept.
    return DetokenizeResponse(prompt=tok.decode(req.tokens, skip_special_tokens=False))
