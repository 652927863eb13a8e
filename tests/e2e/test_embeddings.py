"""End to end: ``/v1/embeddings`` with the official ``openai`` client against our stack
(``configs/embeddings.yaml``: the tiny checkpoint generating on a TT pool as ``tiny-llama`` and
embedding on a vLLM pool with vLLM's pooling runner as ``tiny-embed``) and against bare vLLM 0.32
servers on the same checkpoint with the same flags (``--runner pooling --convert embed`` for the
embedding model; a plain one for the generative model's refusal).

Equal: the vectors (float and base64, the client's default; ``allclose`` with rtol 0, atol 1e-6:
the same engine on the same CPU kernels, so in practice bit-equal), their count, order and
length, the usage; ``/pooling``, ``/score`` and ``/rerank`` bodies (values within the same
tolerance, rerank order and documents exactly); the statuses of the refusals (``dimensions`` on
a model that is not Matryoshka, an empty input list, an input over max_model_len, chat and
completions to the embedding model, another pooling task, mismatched score sides, embeddings
from the generative model).
"""

from __future__ import annotations

import copy
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import yaml

from tests.conftest import REPO_ROOT
from tests.doubles.deployed_app import deployed_app
from tests.e2e.bare_vllm import bare_vllm_server

pytestmark = pytest.mark.slow

APP = "meshserve-e2e-embeddings"
CONFIG = REPO_ROOT / "configs/embeddings.yaml"
EMBED_ARGS = {
    "runner": "pooling",
    "convert": "embed",
    "max_model_len": 512,
    "max_num_seqs": 8,
    "dtype": "float32",
    "enforce_eager": True,
}
INPUTS = [
    "hello world",
    ["def main():\n    return 0", "x", "The quick brown fox jumps over the lazy dog. " * 4],
    [5, 6, 7, 8],
    [[5, 6], [7, 8, 9]],
]
ATOL = 1e-6
# vLLM's other pooling endpoints for an embedding model, with the same checkpoint.
OTHER_CALLS = [
    ("/pooling", {"input": ["hello world", "x"]}),
    ("/pooling", {"input": [5, 6, 7], "task": "embed", "encoding_format": "float"}),
    ("/score", {"queries": "hello", "documents": ["hello world", "bye", "def f(): pass"]}),
    ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d"]}),
    ("/rerank", {"query": "hello", "documents": ["hello world", "bye", "x"], "top_n": 2}),
    ("/v2/rerank", {"query": "hello", "documents": ["hello world", "bye"]}),
]


def _numbers(body: dict) -> dict:
    """What must agree in a pooling/score/rerank body (ids and timestamps differ)."""
    if "results" in body:
        ranked = [(r["index"], r["document"], r["relevance_score"]) for r in body["results"]]
        return {"usage": body["usage"], "order": [r[:2] for r in ranked], "values": [r[2] for r in ranked]}
    values = [d.get("data", d.get("score")) for d in body["data"]]
    usage = {k: body["usage"][k] for k in ("prompt_tokens", "total_tokens")}
    return {"usage": usage, "objects": [d["object"] for d in body["data"]], "values": values}


def _other_endpoints(url: str, model: str) -> list[dict]:
    return [
        _numbers(httpx.post(url + path, json={"model": model, **body}, timeout=60).json()) for path, body in OTHER_CALLS
    ]


def _refusals(url: str, embed_model: str) -> dict[str, int]:
    """Statuses of the requests vLLM refuses on the embedding model."""
    bodies = {
        "dimensions": ("/v1/embeddings", {"model": embed_model, "input": "x", "dimensions": 8}),
        "empty_list": ("/v1/embeddings", {"model": embed_model, "input": []}),
        "too_long": ("/v1/embeddings", {"model": embed_model, "input": [5] * 513}),
        "chat": ("/v1/chat/completions", {"model": embed_model, "messages": [{"role": "user", "content": "hi"}]}),
        "completion": ("/v1/completions", {"model": embed_model, "prompt": "hi", "max_tokens": 2}),
        "pooling_task": ("/pooling", {"model": embed_model, "input": "x", "task": "classify"}),
        "score_lengths": ("/score", {"model": embed_model, "queries": ["a", "b"], "documents": ["c", "d", "e"]}),
    }
    return {name: httpx.post(url + path, json=body, timeout=60).status_code for name, (path, body) in bodies.items()}


def _embeddings(client: openai.OpenAI, model: str) -> list[dict]:
    out = []
    for item in INPUTS:
        for fmt in ("float", openai.NOT_GIVEN):  # the client's default: base64, decoded by it
            r = client.embeddings.create(model=model, input=item, encoding_format=fmt)
            out.append({"vectors": [d.embedding for d in r.data], "index": [d.index for d in r.data], "usage": r.usage})
    return out


@pytest.fixture(scope="module")
def reference(tiny_llama, tmp_path_factory) -> dict:
    """Bare vLLM's answers, one server at a time (the 2-core machine holds one engine well)."""
    logs = tmp_path_factory.mktemp("bare")
    probe = ("/v1/embeddings", {"model": "tiny-embed", "input": "ready?"})
    with bare_vllm_server(tiny_llama, "tiny-embed", EMBED_ARGS, logs / "embed.log", ready_probe=probe) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        answers = {"embeddings": _embeddings(client, "tiny-embed"), "refusals": _refusals(url, "tiny-embed")}
        answers["others"] = _other_endpoints(url, "tiny-embed")
    gen_args = {"max_model_len": 512, "dtype": "float32", "enforce_eager": True}
    with bare_vllm_server(tiny_llama, "tiny-llama", gen_args, logs / "generate.log") as url:
        body = {"model": "tiny-llama", "input": "x"}
        answers["embed_generative"] = httpx.post(f"{url}/v1/embeddings", json=body, timeout=60).status_code
    return answers


@pytest.fixture(scope="module")
def ours(serve_session, reference) -> str:
    args = copy.deepcopy(yaml.safe_load(Path(CONFIG).read_text())["applications"][0]["args"])
    with deployed_app(serve_session, APP, args, "/e2e-embed") as url:
        yield url


def test_embeddings_equal_bare_vllms(reference, ours):
    client = openai.OpenAI(base_url=f"{ours}/v1", api_key="unused", max_retries=0, timeout=120)
    got = _embeddings(client, "tiny-embed")
    assert len(got) == len(reference["embeddings"])
    for mine, theirs in zip(got, reference["embeddings"]):
        assert mine["index"] == theirs["index"]
        assert mine["usage"].prompt_tokens == theirs["usage"].prompt_tokens
        assert mine["usage"].total_tokens == theirs["usage"].total_tokens
        assert [len(v) for v in mine["vectors"]] == [len(v) for v in theirs["vectors"]] != []
        np.testing.assert_allclose(np.asarray(mine["vectors"]), np.asarray(theirs["vectors"]), rtol=0, atol=ATOL)


def test_pooling_score_and_rerank_equal_bare_vllms(reference, ours):
    for mine, theirs in zip(_other_endpoints(ours, "tiny-embed"), reference["others"], strict=True):
        assert {k: v for k, v in mine.items() if k != "values"} == {k: v for k, v in theirs.items() if k != "values"}
        np.testing.assert_allclose(np.asarray(mine["values"]), np.asarray(theirs["values"]), rtol=0, atol=ATOL)


def test_refusals_have_bare_vllms_statuses(reference, ours):
    assert _refusals(ours, "tiny-embed") == reference["refusals"]
    status = httpx.post(f"{ours}/v1/embeddings", json={"model": "tiny-llama", "input": "x"}, timeout=60).status_code
    assert status == reference["embed_generative"] == 404


def test_pins(ours):
    """A pin to the model's own pool that cannot serve the task: 400 naming ``model``; to another
    model's pool: 400 naming the header."""
    chat = {"model": "tiny-embed", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(f"{ours}/v1/chat/completions", json=chat, headers={"x-meshserve-pool": "embed"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    body = {"model": "tiny-embed", "input": "x"}
    r = httpx.post(f"{ours}/v1/embeddings", json=body, headers={"x-meshserve-pool": "tt"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-meshserve-pool"
    r = httpx.post(f"{ours}/v1/embeddings", json=body, headers={"x-meshserve-pool": "embed"}, timeout=60)
    assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 256


def test_the_generative_model_still_generates(ours):
    client = openai.OpenAI(base_url=f"{ours}/v1", api_key="unused", max_retries=0, timeout=120)
    r = client.completions.create(model="tiny-llama", prompt="def", max_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3
