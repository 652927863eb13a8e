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

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from ray import serve

from accel.text.tokenizer import TextTokenizer, load_tokenizer
from deployments.config.app import AppConfig, ModelConfig
from deployments.replicas.local import LocalPoolClient, make_replica
from deployments.router.local_client import LocalRouterClient
from deployments.router.views import RouterSnapshot
from deployments.telemetry.metrics import IngressMetrics
from serve_app.http import embeddings_route, health, invocations, limits, openapi, tokenize_routes
from serve_app.http.auth import ApiKeyMiddleware, key_digests
from serve_app.http.body_limit import BodyLimitMiddleware
from serve_app.http.engine_client import EngineClient
from serve_app.http.json_io import error_response
from serve_app.http.kv_metrics_source import kv_source
from serve_app.http.lora_adapters import AdapterRegistry, AdapterSync
from serve_app.http.lora_routes import load_adapter, runtime_updates_allowed, unload_adapter
from serve_app.http.metrics_route import metrics as metrics_body
from serve_app.http.pipeline.admission import Admission
from serve_app.http.pipeline.endpoint import Endpoint
from serve_app.http.pipeline.endpoints import CHAT, COMPLETIONS, MESSAGES, MESSAGES_TOKEN_COUNT, RESPONSES
from serve_app.http.pipeline.parse import ResolvedModel
from serve_app.http.pipeline.run import GenerationPipeline
from serve_app.http.protocol.chat import ChatCompletionRequest
from serve_app.http.protocol.common import ModelCard, ModelList
from serve_app.http.protocol.completions import CompletionRequest
from serve_app.http.protocol.embeddings import EmbeddingRequest
from serve_app.http.protocol.errors import APIError
from serve_app.http.protocol.pooling import PoolingRequest
from serve_app.http.protocol.tool_request import ChatTools

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
        label = next(iter(self._models)) if len(self._models) == 1 else "unknown"  # before a model resolves
        self._admission = Admission(self._bound, lambda: self._metrics, config.ingress.retry_after_s, label)
        self._pipeline = GenerationPipeline(config, self._client, self._chat_tools, self._resolve_model)
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
        (``EngineReplica.check_health``: its in-flight streams end with the error), or the router
        inside it (its poll loop died), so Serve restarts the replica, engine and all."""
        for pool in self._local_pools.values():
            await pool.check_health()
        await self._client.router.check_health()  # a router in this process (router.placement ingress)

    async def router_snapshot(self) -> RouterSnapshot | None:
        """The snapshot of the router inside this replica (``router.placement: ingress``; None for
        the router deployment, whose handle answers ``snapshot`` itself): called over the ingress's
        Serve handle by tests and benchmarks."""
        router = self._client.router
        return await router.router.snapshot() if isinstance(router, LocalRouterClient) else None

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
        return await self._run(request, COMPLETIONS)

    @app.post("/v1/chat/completions", openapi_extra=openapi.json_body(ChatCompletionRequest))
    async def chat_completions(self, request: Request) -> Response:
        return await self._run(request, CHAT)

    @app.post("/v1/responses")
    async def responses(self, request: Request) -> Response:
        """Stateless Responses API: runs as a chat request (serve_app.http.protocol.responses_api)."""
        return await self._run(request, RESPONSES)

    @app.post("/v1/messages")
    async def messages(self, request: Request) -> Response:
        """Anthropic's Messages API as vLLM serves it: runs as a chat request
        (serve_app.http.protocol.messages_api)."""
        return await self._run(request, MESSAGES)

    @app.post("/v1/messages/count_tokens")
    async def count_message_tokens(self, request: Request) -> Response:
        endpoint = MESSAGES_TOKEN_COUNT
        work = lambda held: self._pipeline.count_tokens(request, endpoint, held)  # noqa: E731
        return await self._admission.serve(work, endpoint.render_error)

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

    @app.post("/v2/embed")
    async def cohere_embed(self, request: Request) -> Response:
        """Cohere's embed API as vLLM serves it for an embedding model (protocol.cohere_embed)."""
        return await self._pooled(embeddings_route.COHERE_EMBED, request)

    @app.post("/invocations")
    async def invocations(self, request: Request) -> Response:
        """SageMaker's entry point as vLLM routes it: the first endpoint the body fits (invocations)."""
        handlers = {
            "chat": self.chat_completions,
            "completions": self.completions,
            "embeddings": self.embeddings,
            "rerank": self.rerank,
            "score": self.score,
            "pooling": self.pooling,
        }
        return await invocations.invoke(request, self._tasks_of, handlers, self._reject)

    def _tasks_of(self, model: str | None) -> frozenset[str]:
        """What ``model``'s pools serve (one we do not serve, or None with several: every task)."""
        pools = self._config.pools
        if model is None and len(self._models) == 1:
            model = next(iter(self._models))
        served = [p for p in pools if p.model == model] or list(pools)
        return frozenset(task for p in served for task in p.tasks)

    async def _pooled(self, api: embeddings_route.PoolingApi, request: Request) -> Response:
        client, ingress = self._client, self._config.ingress
        return await embeddings_route.pooled(api, request, client, self._lookup, self._bound, ingress, self._reject)

    # -- request handling ---------------------------------------------------------------------

    async def _run(self, request: Request, endpoint: Endpoint) -> Response:
        """A generation endpoint's request through the shared stages (serve_app.http.pipeline),
        within the concurrency bound, its errors as statuses."""
        return await self._admission.serve(
            lambda held: self._pipeline.run(request, endpoint, held), endpoint.render_error
        )

    async def _resolve_model(self, name: str | None) -> ResolvedModel:
        """The model ``name`` names (None: the only served one; 404 if none), or the LoRA adapter
        it names on its base model, the runtime set synced first unless ``name`` is a base
        model's (lora_adapters.AdapterSync)."""
        served = None
        if name and name not in self._models:
            await self._adapter_sync.sync()
            served = self._adapters.resolve(name)
        model, tok = self._lookup(served.model.name if served else name)
        return ResolvedModel(model, tok, served)

    def _reject(self, model: str, status: int) -> None:
        self._admission.reject(model, status)


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
