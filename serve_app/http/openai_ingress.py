"""``OpenAIIngress``: the OpenAI-compatible HTTP API (FastAPI on Serve).

Per request: parse and validate (400 naming the field), resolve the model (404), tokenize /
apply the chat template here (engines receive token ids), check the context length (400), then
for every choice (prompts x n) ask the router for a replica and stream from it directly.
Bounded: past ``max_concurrent_requests`` held requests an ingress replica answers 429 with
``Retry-After``; a full engine deployment queue answers 503 (or the configured status).
A client that goes away cancels the engine calls, which abort their engine requests.

Routing to a specific pool: header ``x-meshserve-pool: <pool name>``.
Session affinity key: header ``x-session-id``, else body ``session_id``, ``user`` or
``prompt_cache_key``. The router also gets the prompt's chained block hashes (computed here, at
the model's routing block size, so hashing stays off the router's single thread), unless the
request goes straight to its pool's only replica, where no router decides.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve

from accel.block_hash import BlockHash, hash_prompt_blocks, salted_root
from accel.contract import GenerateRequest, InvalidRequestError, OutputDelta, SamplingParams
from accel.text.tokenizer import TextTokenizer, load_tokenizer
from deployments.config.app import AppConfig, ModelConfig
from deployments.messages.routing import RouteRequest
from deployments.messages.sessions import session_id_from
from deployments.replicas.local import LocalPoolClient, make_replica
from deployments.telemetry.metrics import IngressMetrics
from serve_app.http import embeddings_route, health, limits, openapi, stream_render, tokenize_routes
from serve_app.http.auth import ApiKeyMiddleware, key_digests
from serve_app.http.body_limit import BodyLimitMiddleware
from serve_app.http.engine_client import EngineClient, merge_streams
from serve_app.http.engine_support import check_engine_support
from serve_app.http.json_io import error_response, read_body
from serve_app.http.kv_metrics_source import kv_source
from serve_app.http.lora_adapters import AdapterRegistry, AdapterSync, ServedAdapter
from serve_app.http.lora_routes import load_adapter, runtime_updates_allowed, unload_adapter
from serve_app.http.metrics_route import metrics as metrics_body
from serve_app.http.protocol import conversion as conv
from serve_app.http.protocol import responses as rsp
from serve_app.http.protocol.chat import ChatCompletionRequest, ChatCompletionResponse
from serve_app.http.protocol.common import ModelCard, ModelList, random_id
from serve_app.http.protocol.completions import CompletionRequest
from serve_app.http.protocol.embeddings import EmbeddingRequest
from serve_app.http.protocol.errors import APIError
from serve_app.http.protocol.pooling import PoolingRequest
from serve_app.http.protocol.responses_api import response_events, response_from_chat, responses_call
from serve_app.http.protocol.tool_output import ChoiceParser
from serve_app.http.protocol.tool_request import ChatTools, ToolPlan
from serve_app.http.structured_check import check_structured_outputs
from serve_app.http.workers import in_worker

POOL_HEADER = "x-meshserve-pool"

logger = logging.getLogger(__name__)

app = FastAPI(title="meshserve")


def _serving() -> OpenAIIngress | None:
    """The ingress this replica serves (None outside a Serve replica)."""
    try:
        obj = serve.get_replica_context().servable_object
    except Exception:
        return None
    return obj if isinstance(obj, OpenAIIngress) else None


def _api_key_digests() -> tuple[bytes, ...]:
    ingress = _serving()
    return ingress.api_key_digests if ingress is not None else ()


def _max_request_bytes() -> int | None:
    ingress = _serving()
    return ingress.max_request_bytes if ingress is not None else None


# Outermost first: auth before the body is read.
app.add_middleware(BodyLimitMiddleware, limit_of=_max_request_bytes)
app.add_middleware(ApiKeyMiddleware, keys_of=_api_key_digests)


async def _shut_down_local_engines() -> None:
    """ASGI lifespan shutdown (Serve runs it when it stops the replica): engines inside this
    replica (``placement: ingress``) shut down gracefully."""
    ingress = _serving()
    if ingress is not None:
        await ingress.shutdown_local_engines()


app.router.add_event_handler("shutdown", _shut_down_local_engines)


class OpenAIIngress:
    def __init__(
        self,
        config: AppConfig,
        router_handle: Any,
        pool_handles: Mapping[str, Any],
        engine_factories: Mapping[str, Any] | None = None,
    ):
        """``pool_handles``: the pools with a deployment of their own. A pool with ``placement:
        ingress`` gets its engine built here, in this replica (``engine_factories``: engine kind ->
        ``callable(PoolConfig) -> Engine``, for tests)."""
        self._config = config
        self._local_pools = _start_local_pools(config, engine_factories or {})
        self._models: dict[str, ModelConfig] = {m.name: m for m in config.models}
        self._tokenizers: dict[str, TextTokenizer] = {m.name: load_tokenizer(str(m.path)) for m in config.models}
        self._metrics = _ingress_metrics()
        self._block_sizes = {m.name: m.routing_block_size for m in config.models}
        # vLLM's tool-call / reasoning parsers per model (serve_app.http.protocol.tool_request).
        self._chat_tools = {m.name: ChatTools(m.parsing, m.name, self._tokenizers[m.name]) for m in config.models}
        self._client = EngineClient(
            config,
            router_handle,
            pool_handles,
            self._metrics,
            {n: t.fast for n, t in self._tokenizers.items()},
            local_pools=self._local_pools,
        )
        self._bound = limits.ConcurrencyBound(config.ingress.max_concurrent_requests)
        self.api_key_digests = key_digests(config.ingress.api_keys)
        self.max_request_bytes = config.ingress.max_request_bytes
        self._lookup = tokenize_routes.model_lookup(self._models, self._tokenizers)
        # LoRA adapters served by name (declared + loaded at run time) and vLLM's opt-in to load them.
        self._adapters = AdapterRegistry(config.models)
        self._lora_updates = runtime_updates_allowed()
        # Runtime loads and unloads of every ingress replica, through the router (lora_adapters).
        router, timeout_s = self._client.router, config.router.decision_timeout_s
        self._adapter_sync = AdapterSync(
            self._adapters, lambda: router.lora_adapters(timeout_s), router.set_lora_adapter
        )
        self._token_lookup = self._adapters.lookup_through(self._lookup)  # /tokenize takes adapters as vLLM does

    async def check_health(self) -> None:
        """Serve's periodic probe: fails when an engine inside this replica fails its own check
        (``EngineReplica.check_health``: its in-flight streams end with the error), so Serve
        restarts the replica, engine and all."""
        for pool in self._local_pools.values():
            await pool.check_health()

    async def shutdown_local_engines(self) -> None:
        for pool in self._local_pools.values():
            await pool.shutdown()

    # -- endpoints ----------------------------------------------------------------------------

    @app.get("/health")
    async def health(self) -> Response:
        down = health.unhealthy_models(self._models, self._client.engines)
        if down:
            msg = f"No healthy engine replica serves model(s) {', '.join(down)}."
            return error_response(APIError(503, msg, None, self._config.ingress.retry_after_s))
        return Response(status_code=200)

    @app.get("/ping")
    async def ping_get(self) -> Response:
        """vLLM's (SageMaker's) liveness probe: the same answer as /health."""
        return await self.health()

    @app.post("/ping")
    async def ping_post(self) -> Response:
        return await self.health()

    @app.get("/load")
    async def load(self) -> JSONResponse:
        """vLLM's ``/load``: engine requests in flight through this ingress replica (what vLLM
        counts with ``--enable-server-load-tracking``)."""
        return JSONResponse({"server_load": self._bound.held})

    @app.get("/v1/models")
    async def models(self) -> JSONResponse:
        down = set(health.unhealthy_models(self._models, self._client.engines))
        await self._adapter_sync.sync()
        cards = [
            ModelCard(id=m.name, root=str(m.path), max_model_len=m.max_model_len)
            for m in self._models.values()
            if m.name not in down
        ]
        cards += [  # as vLLM lists adapters: after the base models, parent = base, root = path
            ModelCard(id=a.adapter.name, root=a.adapter.path, parent=a.model.name)
            for a in self._adapters.served()
            if a.model.name not in down
        ]
        return JSONResponse(ModelList(data=cards).model_dump())

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(self, request: Request) -> Response:
        """vLLM's runtime adapter load, with VLLM_ALLOW_RUNTIME_LORA_UPDATING (lora_routes)."""
        return await load_adapter(request, self._adapter_sync, self._lora_updates)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(self, request: Request) -> Response:
        return await unload_adapter(request, self._adapter_sync, self._lora_updates)

    @app.post("/tokenize")
    async def tokenize(self, request: Request) -> JSONResponse:
        return await tokenize_routes.tokenize(request, self._token_lookup, self._config.ingress)

    @app.post("/detokenize")
    async def detokenize(self, request: Request) -> JSONResponse:
        return await tokenize_routes.detokenize(request, self._token_lookup)

    @app.get("/version")
    async def version(self) -> JSONResponse:
        return tokenize_routes.version()

    @app.get("/metrics")
    async def metrics(self) -> Response:
        """vLLM's /metrics: every engine replica's vllm:* series summed, and meshserve:* (metrics_route)."""
        ingress, client = (self._metrics.prom if self._metrics is not None else None), self._client
        kv = kv_source(self._config)
        return await metrics_body(client.engines, ingress, self._bound.held, router=client.router, kv=kv)

    @app.post("/v1/completions", openapi_extra=openapi.json_body(CompletionRequest))
    async def completions(self, request: Request) -> Response:
        return await self._handle(request, is_chat=False)

    @app.post("/v1/chat/completions", openapi_extra=openapi.json_body(ChatCompletionRequest))
    async def chat_completions(self, request: Request) -> Response:
        return await self._handle(request, is_chat=True)

    @app.post("/v1/responses")
    async def responses(self, request: Request) -> Response:
        """Stateless Responses API: runs as a chat request (serve_app.http.protocol.responses_api)."""
        return await self._handle(request, is_chat=True, is_responses=True)

    @app.post("/v1/embeddings", openapi_extra=openapi.json_body(EmbeddingRequest))
    async def embeddings(self, request: Request) -> Response:
        """Pools running vLLM's pooling runner (serve_app.http.embeddings_route)."""
        return await self._pooled(embeddings_route.EMBEDDINGS, request)

    @app.post("/pooling", openapi_extra=openapi.json_body(PoolingRequest))
    async def pooling(self, request: Request) -> Response:
        """vLLM's /pooling for an embedding model: the same vectors in vLLM's pooling shape."""
        return await self._pooled(embeddings_route.POOLING, request)

    @app.post("/score")
    @app.post("/v1/score")
    async def score(self, request: Request) -> Response:
        """vLLM's scoring with an embedding model: cosine similarity of the texts' vectors."""
        return await self._pooled(embeddings_route.SCORE, request)

    @app.post("/rerank")
    @app.post("/v1/rerank")
    @app.post("/v2/rerank")
    async def rerank(self, request: Request) -> Response:
        return await self._pooled(embeddings_route.RERANK, request)

    async def _pooled(self, api: embeddings_route.PoolingApi, request: Request) -> Response:
        client, ingress = self._client, self._config.ingress
        return await embeddings_route.pooled(api, request, client, self._lookup, self._bound, ingress, self._reject)

    # -- request handling ---------------------------------------------------------------------

    async def _handle(self, request: Request, is_chat: bool, is_responses: bool = False) -> Response:
        # Label of rejects: the served model the request resolved to; before that (or for an
        # unknown name, which must not become a label value) the only served model, else "unknown".
        label = {"model": next(iter(self._models)) if len(self._models) == 1 else "unknown"}
        # One slot while parsing; the rest of the request's fan-out (prompts x n) once known.
        held = [1]
        if not self._enter(1):
            self._reject(label["model"], 429)
            return error_response(
                APIError(429, "Too many requests in flight; retry later.", None, self._config.ingress.retry_after_s)
            )
        streaming = False
        try:
            response = await self._prepare(request, is_chat, label, held, is_responses)
            if isinstance(response, StreamingResponse):
                streaming = True
                response.body_iterator = self._leave_after(response.body_iterator, held[0])
            return response
        except APIError as err:
            self._reject(label["model"], err.status)
            return error_response(err)
        except InvalidRequestError as err:
            self._reject(label["model"], 400)
            return error_response(APIError(400, err.message, err.field))
        except Exception:
            # Details go to the log only: a client never sees internal type names or messages.
            logger.exception("request failed")
            self._reject(label["model"], 500)
            return error_response(APIError(500, "Internal server error; see the server log."))
        finally:
            if not streaming:  # a stream leaves when its body generator ends
                self._leave(held[0])

    async def _prepare(
        self, request: Request, is_chat: bool, label: dict[str, str], held: list[int], is_responses: bool = False
    ) -> Response:
        body = await read_body(request)
        call = None
        if is_responses:
            call = responses_call(body)
            body = call.chat_body
        req = conv.parse_request(body, is_chat)
        served = await self._resolve_adapter(req.model)  # model: <a LoRA adapter>
        model, tok = self._lookup(served.model.name if served else req.model)  # None: the only served one
        label["model"] = model.name
        limits.check_body(body, is_chat, self._config.ingress, model.max_model_len)
        tools, plan = self._chat_tools[model.name], None
        if isinstance(req, ChatCompletionRequest):
            plan = tools.prepare(body) if tools.needs_plan(body) else None
        pool = request.headers.get(POOL_HEADER)
        # Prefix hashes only for a request the router will place, not one going to its only replica.
        block_size = self._block_sizes[model.name] if self._client.needs_prefix_hashes(model.name, pool) else None
        # Templates, tokenization and hashing off the event loop, in one hop: a long prompt must
        # not stall other requests.
        lora = served.adapter.name if served else None
        prompts, hashes = await in_worker(_prompts_and_hashes, req, tok, model.max_model_len, plan, block_size, lora)
        sampling = [tools.apply(plan, conv.sampling_params(req, len(p), model.max_model_len, tok), p) for p in prompts]
        sampling = limits.cap_max_tokens(sampling, req, self._config.ingress)
        _check_token_ids(sampling, tok.vocab_size)
        await check_structured_outputs(sampling[0].structured_outputs)
        prefix = "chatcmpl" if is_chat else "cmpl"
        # Engine ids stay unique even when clients reuse an X-Request-Id; the response carries theirs.
        base_id = random_id(prefix)
        session = session_id_from(request.headers, req.session_id or req.user, req.prompt_cache_key)
        greqs = _with_adapter(
            conv.generate_requests(base_id, prompts, sampling, req.n, session, req.cache_salt), served
        )
        self._bound.check_fan_out(len(greqs) - 1, self._config.ingress.retry_after_s)
        held[0] = len(greqs)
        self._set_inflight_gauge()
        routes = [
            RouteRequest(
                g.request_id, model.name, g.num_prompt_tokens, pool, session, hashes[g.prompt_token_ids], lora=lora
            )
            for g in greqs
        ]
        self._client.check_routable(routes[0])
        check_engine_support(routes[0], self._config.pools, sampling[0])
        streams = self._client.stream_choices(greqs, routes)
        stream_opts = req.stream_options
        opts = rsp.RenderOptions(
            request_id=conv.response_id(prefix, request.headers.get("x-request-id"), req),
            created=int(time.time()),
            model=lora or model.name,  # vLLM answers with the adapter's name
            num_logprobs=greqs[0].sampling.logprobs,
            return_token_ids=bool(req.return_token_ids),
            include_usage=bool(stream_opts and stream_opts.include_usage),
            continuous_usage=bool(stream_opts and stream_opts.include_usage and stream_opts.continuous_usage_stats),
            num_prompt_tokens=len(prompts[0]),
            tokens_as_ids=bool(req.return_tokens_as_token_ids),
            echo=conv.echo_texts(req, tok),
            echo_only=conv.echo_only(req),
        )
        choices = [rsp.ChoiceState(index=i, prompt_index=i // req.n) for i in range(len(greqs))]
        # Output parsers only for a model with vLLM parsers (without one, every choice is plain content).
        parsers = (
            [ChoiceParser(tools, plan, prompts[0]) for _ in choices] if plan is not None and tools.has_parser else None
        )
        merged = merge_streams(streams)
        if not req.stream:
            out = await stream_render.collect(merged, choices, opts, tok, prompts, is_chat, parsers)
            if call is not None:
                assert isinstance(out, ChatCompletionResponse)
                return JSONResponse(response_from_chat(call, out, sampling[0].max_tokens))
            return JSONResponse(rsp.with_openai_nulls(out.model_dump(exclude_none=True)))
        # Wait for the first delta before answering 200, so early failures keep their status.
        first: tuple[int, OutputDelta] | None
        try:
            first = await merged.__anext__()
        except StopAsyncIteration:
            first = None
        except BaseException:
            await merged.aclose()
            raise
        body_gen: AsyncIterator[str]
        if is_chat:
            body_gen = stream_render.chat_sse(merged, first, choices, opts, tok, parsers)
            if call is not None:
                body_gen = response_events(call, lora or model.name, sampling[0].max_tokens, body_gen)
        else:
            body_gen = stream_render.completion_sse(merged, first, choices, opts, tok)
        return StreamingResponse(body_gen, media_type="text/event-stream")

    async def _resolve_adapter(self, name: str | None) -> ServedAdapter | None:
        """The LoRA adapter ``name`` names (None: a base model, or nothing), the runtime set synced
        first unless ``name`` is a base model's (lora_adapters.AdapterSync)."""
        if not name or name in self._models:
            return None
        await self._adapter_sync.sync()
        return self._adapters.resolve(name)

    async def _leave_after(self, body: AsyncIterable[Any], slots: int) -> AsyncIterator[Any]:
        try:
            async for line in body:
                yield line
        finally:
            self._leave(slots)

    def _enter(self, slots: int) -> bool:
        if not self._bound.try_acquire(slots):
            return False
        self._set_inflight_gauge()
        return True

    def _leave(self, slots: int) -> None:
        self._bound.release(slots)
        self._set_inflight_gauge()

    def _set_inflight_gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.inflight.set(self._bound.held)

    def _reject(self, model: str, status: int) -> None:
        if self._metrics is not None:
            self._metrics.reject(model, status)


def _prompts_and_hashes(
    req: CompletionRequest | ChatCompletionRequest,
    tok: TextTokenizer,
    max_model_len: int,
    plan: ToolPlan | None,
    block_size: int | None,
    lora: str | None = None,
) -> tuple[list[tuple[int, ...]], dict[tuple[int, ...], tuple[BlockHash, ...]]]:
    """The request's prompt ids and each distinct prompt's chained block hashes; without a
    ``block_size`` none (``()``): the request goes to its pool's only replica, no router to tell.
    A request with a LoRA adapter (``lora``) roots its chain at the adapter too."""
    prompts = conv.request_prompts(req, tok, max_model_len, plan)
    if block_size is None:
        return prompts, dict.fromkeys(prompts, ())
    # Every choice carries the request's cache_salt: one chain root (salted prompts share no hash).
    root = salted_root(req.cache_salt, lora)
    return prompts, {ids: tuple(hash_prompt_blocks(ids, block_size, root)) for ids in set(prompts)}


def _with_adapter(greqs: list[GenerateRequest], served: ServedAdapter | None) -> list[GenerateRequest]:
    """Each engine request carries the adapter whole, so any replica of a LoRA pool can run it."""
    return greqs if served is None else [dataclasses.replace(g, lora=served.adapter) for g in greqs]


def _check_token_ids(sampling: Sequence[SamplingParams], vocab_size: int) -> None:
    for sp in sampling:
        for tid, _ in sp.logit_bias:
            if tid >= vocab_size:
                raise APIError(400, f"logit_bias token id {tid} is out of vocabulary (size {vocab_size})", "logit_bias")
        for tid in sp.stop_token_ids:
            if tid >= vocab_size:
                raise APIError(400, f"stop token id {tid} is out of vocabulary (size {vocab_size})", "stop_token_ids")
        bad = [t for t in sp.allowed_token_ids or () if t >= vocab_size]
        if bad:
            raise APIError(400, f"allowed_token_ids contains out-of-vocab token id! {bad}", "allowed_token_ids")


def _start_local_pools(config: AppConfig, engine_factories: Mapping[str, Any]) -> dict[str, LocalPoolClient]:
    local = [p for p in config.pools if p.placement == "ingress"]
    if not local:
        return {}
    # (A constructor that fails takes the replica's process down with what it started: vLLM's
    # engine core and the TT engine's threads end with their parent.)
    return {
        pool.name: LocalPoolClient(
            make_replica(pool, engine_factories.get(pool.engine), config.router.kv_event_log_size)
        )
        for pool in local
    }


def _ingress_metrics() -> IngressMetrics | None:
    try:
        return IngressMetrics()
    except Exception:  # outside a Ray worker (unit tests)
        return None


def make_ingress_class() -> Any:
    """``OpenAIIngress`` with its FastAPI app attached (``@serve.ingress``)."""
    return serve.ingress(app)(OpenAIIngress)
