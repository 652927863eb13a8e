"""One ``configs/tiny.yaml`` app on the session's Serve for the whole package (every module of
it shares the deployment), with the official ``openai`` client pointed at it."""

from __future__ import annotations

import openai
import pytest

from tests.doubles.app_args import local_app_args
from tests.doubles.deployed_app import deployed_app
from tests.e2e.openai_api.local_app import APP, MAX_CONCURRENT


@pytest.fixture(scope="package")
def base_url(serve_session, tiny_llama):
    args = local_app_args()
    args["ingress"]["max_concurrent_requests"] = MAX_CONCURRENT
    with deployed_app(serve_session, APP, args, "/e2e") as url:
        yield url


@pytest.fixture(scope="package")
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="package")
def tok(tiny_llama):
    from accel.text.tokenizer import load_tokenizer

    return load_tokenizer(str(tiny_llama))
