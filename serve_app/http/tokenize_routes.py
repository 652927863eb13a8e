"""The ingress's non-generating routes, as vLLM's server has them: ``POST /tokenize``,
``POST /detokenize`` (``vllm/entrypoints/serve/tokenize``) and ``GET /version``
(``vllm/entrypoints/serve/instrumentator/basic.py``). They run in the ingress (it holds every
model's tokenizer); no engine is involved."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Mapping

from fastapi import Request
from fastapi.responses import JSONResponse

from accel.contract import InvalidRequestError
from accel.text.tokenizer import TextTokenizer
from deployments.config.app import ModelConfig
from deployments.config.ingress import IngressConfig
from serve_app.http import limits
from serve_app.http.json_io import error_response, read_body
from serve_app.http.protocol import tokenize as tk
from serve_app.http.protocol.conversion import parse_body
from serve_app.http.protocol.errors import APIError, bad_request, model_not_found
from serve_app.http.workers import in_worker

# What vLLM's tokenize request models accept beyond what we render (no tools / template kwargs /
# multimodal yet): a 400 naming the field when used, never dropped.
_REFUSED_CHAT_FIELDS = ("tools", "chat_template_kwargs", "media_io_kwargs", "mm_processor_kwargs")

ModelLookup = Callable[[str | None], tuple[ModelConfig, TextTokenizer]]


def model_lookup(models: Mapping[str, ModelConfig], tokenizers: Mapping[str, TextTokenizer]) -> ModelLookup:
    """A request's model (no ``model``: the only served one, as vLLM's server does) and its
    tokenizer; 404 for an unknown name."""

    def lookup(name: str | None) -> tuple[ModelConfig, TextTokenizer]:
        resolved = name if name is not None or len(models) != 1 else next(iter(models))
        model = models.get(resolved or "")
        if model is None:
            raise model_not_found(name)
        return model, tokenizers[model.name]

    return lookup


async def tokenize(request: Request, lookup: ModelLookup, limits_of: IngressConfig | None = None) -> JSONResponse:
    """``limits_of``: the ingress's limits (untrusted chat templates, invalid Unicode, the
    character cap), checked before the tokenizer runs, in a worker thread."""
    try:
        body = await read_body(request)
        req: tk.TokenizeChatRequest | tk.TokenizeCompletionRequest
        if tk.is_chat_body(body):
            for name in _REFUSED_CHAT_FIELDS:
                if body.get(name):
                    raise bad_request(f"`{name}` is not supported by this server's /tokenize.", name)
            req = parse_body(tk.TokenizeChatRequest, body)
        else:
            req = parse_body(tk.TokenizeCompletionRequest, body)
        model, tok = lookup(req.model)
        if limits_of is not None:
            limits.check_body(body, tk.is_chat_body(body), limits_of, model.max_model_len)
        return JSONResponse((await in_worker(tk.tokenize, req, tok, model.max_model_len)).model_dump())
    except APIError as err:
        return error_response(err)
    except InvalidRequestError as err:
        return error_response(APIError(400, err.message, err.field))


async def detokenize(request: Request, lookup: ModelLookup) -> JSONResponse:
    try:
        req = parse_body(tk.DetokenizeRequest, await read_body(request))
        _, tok = lookup(req.model)
        return JSONResponse(tk.detokenize(req, tok).model_dump())
    except APIError as err:
        return error_response(err)


def version() -> JSONResponse:
    """vLLM's shape, ``{"version": ...}``, with meshserve's own version."""
    try:
        ours = importlib.metadata.version("meshserve")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
        ours = "unknown"
    return JSONResponse({"version": ours})
