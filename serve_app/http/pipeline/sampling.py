"""Stage 3, sampling: each prompt's engine sampling params, the one place ``max_tokens`` is
decided (the request's value or the room left in the context, the tool plan's constraint, then
``max_tokens_cap``), and their vocabulary and structured-output checks."""

from __future__ import annotations

from collections.abc import Mapping

from accel.contract import SamplingParams
from deployments.config.ingress import IngressConfig
from serve_app.http import limits
from serve_app.http.pipeline.parse import Parsed
from serve_app.http.pipeline.prompt import Prompts
from serve_app.http.protocol import conversion as conv
from serve_app.http.protocol.errors import APIError
from serve_app.http.protocol.tool_request import ChatTools
from serve_app.http.structured_check import check_structured_outputs


async def sampling(
    parsed: Parsed, prompts: Prompts, tools: Mapping[str, ChatTools], config: IngressConfig
) -> tuple[SamplingParams, ...]:
    """One ``SamplingParams`` per prompt, in order."""
    req, model, tok = parsed.request, parsed.target.model, parsed.target.tok
    chat_tools = tools[model.name]
    params = [
        chat_tools.apply(parsed.plan, conv.sampling_params(req, len(p), model.max_model_len, tok), p)
        for p in prompts.token_ids
    ]
    capped = tuple(limits.cap_max_tokens(params, req, config))
    check_token_ids(capped, tok.vocab_size)
    await check_structured_outputs(capped[0].structured_outputs)
    return capped


def check_token_ids(sampling: tuple[SamplingParams, ...], vocab_size: int) -> None:
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
