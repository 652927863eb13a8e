"""``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter`` as ``vllm serve`` 0.32
has them: only with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` set as vLLM reads it (``1`` or
``true``; else the path does not exist: 404), vLLM's request bodies, a 200 with vLLM's plain-text
message, or vLLM's error body and status (``lora_adapters.AdapterRegistry``).

A loaded adapter is served by every replica of the model's LoRA pools at once, those started
later included: each engine request carries the adapter (``lora_adapters``). The ingress replica
that takes a load or unload syncs first (so its checks see the others' changes) and publishes it
before answering (``lora_adapters.AdapterSync``).
"""

from __future__ import annotations

import os

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from serve_app.http.json_io import error_response, read_body
from serve_app.http.lora_adapters import AdapterSync, LoraAnswer
from serve_app.http.protocol.conversion import parse_body
from serve_app.http.protocol.errors import APIError, ErrorInfo, ErrorResponse

RUNTIME_UPDATES_VAR = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def runtime_updates_allowed() -> bool:
    """vLLM's opt-in, parsed as ``vllm.envs`` parses it."""
    return os.environ.get(RUNTIME_UPDATES_VAR, "0").strip().lower() in ("1", "true")


class LoadLoRAAdapterRequest(BaseModel):
    """vLLM's ``vllm.entrypoints.serve.lora.protocol.LoadLoRAAdapterRequest``."""

    lora_name: str
    lora_path: str
    load_inplace: bool = False
    is_3d_lora_weight: bool = False


class UnloadLoRAAdapterRequest(BaseModel):
    """vLLM's ``UnloadLoRAAdapterRequest``."""

    lora_name: str
    lora_int_id: int | None = None


def _not_found() -> JSONResponse:
    return JSONResponse({"detail": "Not Found"}, status_code=404)  # FastAPI's, for a route vLLM did not attach


def _render(answer: LoraAnswer) -> Response:
    if answer.status == 200:
        return Response(status_code=200, content=answer.message)
    info = ErrorInfo(message=answer.message, type=answer.error_type, param=None, code=answer.status)
    return JSONResponse(ErrorResponse(error=info).model_dump(), status_code=answer.status)


async def load_adapter(request: Request, adapters: AdapterSync, allowed: bool) -> Response:
    if not allowed:
        return _not_found()
    try:
        body = parse_body(LoadLoRAAdapterRequest, await read_body(request))
    except APIError as err:
        return error_response(err)
    await adapters.sync(force=True)
    answer = adapters.registry.load(body.lora_name, body.lora_path, body.load_inplace)
    if answer.status == 200:
        await adapters.publish(body.lora_name, body.lora_path)
    return _render(answer)


async def unload_adapter(request: Request, adapters: AdapterSync, allowed: bool) -> Response:
    if not allowed:
        return _not_found()
    try:
        body = parse_body(UnloadLoRAAdapterRequest, await read_body(request))
    except APIError as err:
        return error_response(err)
    await adapters.sync(force=True)
    answer = adapters.registry.unload(body.lora_name)
    if answer.status == 200:
        await adapters.publish(body.lora_name, None)
    return _render(answer)
