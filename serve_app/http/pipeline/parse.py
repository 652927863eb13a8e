"""Stage 1, parse: the only stage that reads the raw body. The endpoint parses it, the model
(or LoRA adapter) is resolved, and the body's limits and the tool plan are decided here."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from fastapi import Request

from accel.text.tokenizer import TextTokenizer
from deployments.config.app import ModelConfig
from deployments.config.ingress import IngressConfig
from deployments.messages.sessions import session_id_from
from serve_app.http import limits
from serve_app.http.json_io import read_body
from serve_app.http.lora_adapters import ServedAdapter
from serve_app.http.pipeline.endpoint import Endpoint, EndpointRequest
from serve_app.http.protocol.chat import ChatCompletionRequest
from serve_app.http.protocol.completions import CompletionRequest
from serve_app.http.protocol.tool_request import ChatTools, ToolPlan

POOL_HEADER = "x-meshserve-pool"  # pins a request to one pool


@dataclass(frozen=True)
class ResolvedModel:
    """What a request's ``model`` names: a served model, or a LoRA adapter on its base model."""

    model: ModelConfig  # the base model: its engines, limits and tokenizer serve the request
    tok: TextTokenizer
    adapter: ServedAdapter | None = None

    @property
    def lora(self) -> str | None:
        return self.adapter.adapter.name if self.adapter is not None else None

    @property
    def served_name(self) -> str:
        """The name responses carry: vLLM answers with the adapter's name."""
        return self.lora or self.model.name


ModelResolver = Callable[[str | None], Awaitable[ResolvedModel]]  # 404 for an unknown name


@dataclass(frozen=True)
class Parsed:
    endpoint: EndpointRequest
    target: ResolvedModel
    plan: ToolPlan | None  # tools / reasoning / structured constraint of a chat request
    pool: str | None  # x-meshserve-pool
    session: str | None
    header_request_id: str | None

    @property
    def request(self) -> CompletionRequest | ChatCompletionRequest:
        return self.endpoint.request


async def parse(
    http: Request, endpoint: Endpoint, resolve: ModelResolver, tools: Mapping[str, ChatTools], config: IngressConfig
) -> Parsed:
    parsed = endpoint.read(await read_body(http))
    target = await resolve(parsed.request.model)
    parsed = endpoint.for_model(parsed, target.tok)
    req = parsed.request
    # The request's type, not the endpoint, says which body fields hold the prompt.
    is_chat = isinstance(req, ChatCompletionRequest)
    limits.check_body(parsed.body, is_chat, config, target.model.max_model_len)
    limits.check_n(req.n, config)
    chat_tools = tools[target.model.name]
    plan = chat_tools.prepare(parsed.body) if is_chat and chat_tools.needs_plan(parsed.body) else None
    headers = http.headers
    session = session_id_from(headers, req.session_id or req.user, req.prompt_cache_key)
    return Parsed(parsed, target, plan, headers.get(POOL_HEADER), session, headers.get("x-request-id"))
