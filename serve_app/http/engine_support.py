"""Request features that not every engine kind has: a 400 naming the field when a request that
uses one could reach an engine without it (never a silent drop, never a failure mid-flight).

``prompt_logprobs``: vLLM computes them in its prefill; the TT mesh engine has no prompt-logprob
path, and under prefill/decode disaggregation the decode engine imports the prompt's KV instead
of computing it. So a request asking for them must be able to run only on pools of vLLM engines
that prefill it themselves: pin one (``x-meshserve-pool``) when the model also has TT pools.
"""

from __future__ import annotations

from collections.abc import Sequence

from accel.contract import SamplingParams
from deployments.config.app import PoolConfig
from deployments.messages.routing import RouteRequest, RoutingError, eligible_pools
from serve_app.http.protocol.errors import APIError


def check_engine_support(route: RouteRequest, pools: Sequence[PoolConfig], sampling: SamplingParams) -> None:
    if sampling.prompt_logprobs is None:
        return
    try:
        eligible = eligible_pools(route, pools)
    except RoutingError:
        return  # check_routable answers that one
    tt = [p.name for p in eligible if p.engine == "tt"]
    if tt:
        raise APIError(
            400,
            f"prompt_logprobs are not supported by the TT mesh engine (pools {tt}); "
            "pin a vLLM pool with the x-meshserve-pool header",
            "prompt_logprobs",
        )
    if route.pool is None and any(p.model == route.model and p.role == "prefill" for p in pools):
        raise APIError(
            400,
            "prompt_logprobs are not available under prefill/decode disaggregation; "
            "pin a pool with the x-meshserve-pool header",
            "prompt_logprobs",
        )
