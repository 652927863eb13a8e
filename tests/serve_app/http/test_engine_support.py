"""prompt_logprobs only where every engine that may serve the request computes them."""

from __future__ import annotations

import pytest

from accel.contract import SamplingParams
from deployments.config.load import load_app_config
from deployments.messages.routing import RouteRequest
from serve_app.http.engine_support import check_engine_support
from serve_app.http.protocol.errors import APIError


@pytest.fixture(scope="module")
def pools(tiny_llama):
    def pool(name, engine, **kw):
        args = {"max_model_len": 256} if engine == "tt" else {"max_model_len": 256, "block_size": 32}
        return {
            "name": name,
            "engine": engine,
            "accelerator": "cpu",
            "model": "m",
            "engine_args": args,
            "replicas": 1,
            **kw,
        }

    return load_app_config(
        {"models": [{"name": "m", "path": str(tiny_llama)}], "pools": [pool("tt", "tt"), pool("vllm", "vllm")]}
    ).pools


def _route(pool=None):
    return RouteRequest("r", "m", 4, pool, None, ())


def test_prompt_logprobs_need_a_vllm_pool(pools):
    asks = SamplingParams(prompt_logprobs=1)
    check_engine_support(_route("vllm"), pools, asks)
    check_engine_support(_route(), pools, SamplingParams())  # not asked: anything goes
    for pinned in (None, "tt"):  # unpinned, the router may choose the TT pool
        with pytest.raises(APIError) as err:
            check_engine_support(_route(pinned), pools, asks)
        assert err.value.status == 400 and err.value.param == "prompt_logprobs"
