"""The generation pipeline: one request's path through the shared stages, top to bottom.

parse (the raw body, limits, model) -> prompt (template, tokens, hashes) -> sampling (max_tokens)
-> engine requests -> route (slots, pool checks) -> stream -> render (the endpoint's).
The single-replica question (does a router place this request?) is asked once, before hashing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from accel.contract import OutputDelta, SamplingParams
from deployments.config.app import AppConfig
from deployments.messages.routing import PoolNeeds
from serve_app.http.engine_client import EngineClient, Placement
from serve_app.http.engine_support import check_engine_support
from serve_app.http.pipeline.admission import Admitted
from serve_app.http.pipeline.endpoint import Endpoint, Generation
from serve_app.http.pipeline.engine_requests import EngineRequests, engine_requests
from serve_app.http.pipeline.parse import ModelResolver, Parsed, parse
from serve_app.http.pipeline.prompt import Prompts, prompt
from serve_app.http.pipeline.sampling import sampling
from serve_app.http.protocol import conversion as conv
from serve_app.http.protocol import responses as rsp
from serve_app.http.protocol.max_tokens import echo_only
from serve_app.http.protocol.messages_api import token_count_body
from serve_app.http.protocol.tool_output import ChoiceParser
from serve_app.http.protocol.tool_request import ChatTools
from serve_app.http.stream_merge import merge_streams


class GenerationPipeline:
    def __init__(self, config: AppConfig, client: EngineClient, tools: Mapping[str, ChatTools], resolve: ModelResolver):
        self._config = config
        self._client = client
        self._tools = tools
        self._resolve = resolve

    async def run(self, http: Request, endpoint: Endpoint, held: Admitted) -> Response:
        ingress = self._config.ingress
        parsed = await parse(http, endpoint, self._resolve, self._tools, ingress)
        held.resolved(parsed.target.model.name)
        model = parsed.target.model
        # Asked once: prefix hashes only for a request the router will place, not one going
        # straight to its pool's only replica.
        placement = self._client.placement(PoolNeeds(model.name, parsed.pool, lora=parsed.target.lora))
        prompts = await prompt(parsed, model.routing_block_size if placement.by_router else None)
        params = await sampling(parsed, prompts, self._tools, ingress)
        planned = engine_requests(parsed, endpoint.id_prefix, prompts, params)
        held.take_fan_out(len(planned.generate))
        self._client.check_routable(planned.routes[0])
        check_engine_support(planned.routes[0], self._config.pools, params[0])
        gen = self._generation(parsed, endpoint, prompts, params, planned, placement)
        if not parsed.request.stream:
            return await endpoint.render_body(gen)
        return await _stream(endpoint, gen)

    async def count_tokens(self, http: Request, endpoint: Endpoint, held: Admitted) -> Response:
        """The parse and prompt stages only: the prompt's token count (Anthropic's
        ``count_tokens``, answered as vLLM 0.32 answers it)."""
        parsed = await parse(http, endpoint, self._resolve, self._tools, self._config.ingress)
        held.resolved(parsed.target.model.name)
        count = len((await prompt(parsed, None)).token_ids[0])
        return JSONResponse(token_count_body(count))

    def _generation(
        self,
        parsed: Parsed,
        endpoint: Endpoint,
        prompts: Prompts,
        params: tuple[SamplingParams, ...],
        planned: EngineRequests,
        placement: Placement,
    ) -> Generation:
        req, tok = parsed.request, parsed.target.tok
        streams = self._client.stream_choices(list(planned.generate), list(planned.routes), placement)
        choices = [rsp.ChoiceState(index=i, prompt_index=i // req.n) for i in range(len(planned.generate))]
        tools = self._tools[parsed.target.model.name]
        # Output parsers only for a model with vLLM parsers (without one, every choice is plain content).
        parsers = None
        if parsed.plan is not None and tools.has_parser:
            parsers = [ChoiceParser(tools, parsed.plan, prompts.token_ids[0]) for _ in choices]
        opts = _render_options(parsed, endpoint, prompts, planned)
        merged, state = merge_streams(streams), parsed.endpoint.state
        return Generation(merged, choices, opts, tok, prompts.token_ids, parsers, params[0].max_tokens, state)


def _render_options(parsed: Parsed, endpoint: Endpoint, prompts: Prompts, planned: EngineRequests) -> rsp.RenderOptions:
    req, stream_opts = parsed.request, parsed.request.stream_options
    usage = bool(stream_opts and stream_opts.include_usage)
    return rsp.RenderOptions(
        request_id=conv.response_id(endpoint.id_prefix, parsed.header_request_id, req),
        created=int(time.time()),
        model=parsed.target.served_name,
        num_logprobs=planned.generate[0].sampling.logprobs,
        return_token_ids=bool(req.return_token_ids),
        include_usage=usage,
        continuous_usage=bool(usage and stream_opts and stream_opts.continuous_usage_stats),
        num_prompt_tokens=len(prompts.token_ids[0]),
        tokens_as_ids=bool(req.return_tokens_as_token_ids),
        echo=conv.echo_texts(req, parsed.target.tok),
        echo_only=echo_only(req),
    )


async def _stream(endpoint: Endpoint, gen: Generation) -> Response:
    # Wait for the first delta before answering 200, so early failures keep their status.
    first: tuple[int, OutputDelta] | None
    try:
        first = await gen.merged.__anext__()
    except StopAsyncIteration:
        first = None
    except BaseException:
        await gen.merged.aclose()
        raise
    return StreamingResponse(endpoint.render_stream(gen, first), media_type="text/event-stream")
