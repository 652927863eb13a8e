"""Stage 4, engine requests: one ``GenerateRequest`` per choice (prompts x n) and the
``RouteRequest`` the router places it by."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from accel.contract import GenerateRequest, SamplingParams
from deployments.messages.routing import RouteRequest
from serve_app.http.pipeline.parse import Parsed
from serve_app.http.pipeline.prompt import Prompts
from serve_app.http.protocol import conversion as conv
from serve_app.http.protocol.common import random_id


@dataclass(frozen=True)
class EngineRequests:
    generate: tuple[GenerateRequest, ...]  # choice i is prompt i // n, sample i % n
    routes: tuple[RouteRequest, ...]  # routes[i] places generate[i]


def engine_requests(
    parsed: Parsed, id_prefix: str, prompts: Prompts, sampling: tuple[SamplingParams, ...]
) -> EngineRequests:
    req, target = parsed.request, parsed.target
    # Engine ids stay unique even when clients reuse an X-Request-Id; the response carries theirs.
    greqs = conv.generate_requests(
        random_id(id_prefix), list(prompts.token_ids), list(sampling), req.n, parsed.session, req.cache_salt
    )
    if prompts.images:  # (a chat: one prompt, every choice sees its images)
        greqs = [dataclasses.replace(g, images=prompts.images) for g in greqs]
    pool = prompts.images_pool or parsed.pool
    if target.adapter is not None:  # the adapter whole, so any replica of a LoRA pool can run it
        greqs = [dataclasses.replace(g, lora=target.adapter.adapter) for g in greqs]
    routes = tuple(
        RouteRequest(
            g.request_id,
            target.model.name,
            g.num_prompt_tokens,
            pool,
            parsed.session,
            prompts.hashes[g.prompt_token_ids],
            lora=target.lora,
        )
        for g in greqs
    )
    return EngineRequests(tuple(greqs), routes)
