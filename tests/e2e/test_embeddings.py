"""End to end: ``/v1/embeddings`` with the official ``openai`` client against our stack
(``configs/embeddings.yaml``: the tiny checkpoint generating on a TT pool as ``tiny-llama`` and
embedding on a vLLM pool with vLLM's pooling runner as ``tiny-embed``) and against bare vLLM 0.32
servers on the same checkpoint with the same flags (``--runner pooling --convert embed`` for the
embedding model; a plain one for the generative model's refusal).

Equal: the vectors (float and base64, the client's default; ``allclose`` with rtol 0, atol 1e-6:
the same engine on the same CPU kernels, so in practice bit-equal), their count, order and
length, the usage; the chat form (``messages``, a batch, a conversation in ``input``; ``/pooling``
with ``messages``); the ``bytes`` / ``bytes_only`` bodies (vectors decoded, metadata but id and
created); Cohere's ``/v2/embed`` (every embedding type, ``inputs``, truncation); ``/invocations``
(each endpoint it routes to, and a completion on the generative model); ``/pooling``, ``/score``
and ``/rerank`` bodies (values within the same tolerance, rerank order and documents exactly);
the statuses of the refusals (``dimensions`` on a model that is not Matryoshka, an empty input
list, an input over max_model_len, chat and completions to the embedding model, another pooling
task, mismatched score sides, an ``input_type`` the model has no instruction for, ``truncate:
NONE`` over ``max_tokens``, a body ``/invocations`` cannot place, embeddings from the generative
model).
"""

from __future__ import annotations

import base64
import copy
import json
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


CONVERSATION = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hello world"}]
# The chat form, binary bodies, Cohere's /v2/embed and /invocations (path, body) on the embedding model.
MORE_CALLS = [
    ("/v1/embeddings", {"messages": CONVERSATION}),
    ("/v1/embeddings", {"messages": [CONVERSATION, CONVERSATION[1:]], "add_generation_prompt": True}),
    ("/v1/embeddings", {"input": CONVERSATION, "truncate_prompt_tokens": 5}),
    ("/pooling", {"messages": CONVERSATION, "encoding_format": "float"}),
    ("/v1/embeddings", {"input": ["hello world", "x"], "encoding_format": "bytes"}),
    ("/v1/embeddings", {"input": [5, 6, 7], "encoding_format": "bytes", "embed_dtype": "float16", "endianness": "big"}),
    ("/v1/embeddings", {"input": "x", "encoding_format": "bytes_only"}),
    ("/pooling", {"input": "x", "encoding_format": "bytes", "embed_dtype": "bfloat16"}),
    ("/v1/embeddings", {"input": "x", "encoding_format": "base64", "embed_dtype": "fp8_e4m3"}),
    ("/v2/embed", {"texts": ["hello world", "x"], "embedding_types": ["float", "binary", "ubinary", "base64"]}),
    ("/v2/embed", {"inputs": [{"content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "x"}]}]}),
    ("/v2/embed", {"texts": ["The quick brown fox jumps"], "truncate": "START", "max_tokens": 3}),
    ("/invocations", {"input": ["hello world", "x"]}),
    ("/invocations", {"query": "hello", "documents": ["hello world", "bye"]}),
    ("/invocations", {"queries": "hello", "documents": ["hello world", "bye"]}),
    ("/invocations", {"messages": CONVERSATION}),
]


def _comparable(response: httpx.Response) -> dict:
    """What must agree in any answer of MORE_CALLS (ids and timestamps differ): JSON bodies with
    their numbers apart, binary ones as their vectors and metadata."""
    if response.headers["content-type"] == "application/octet-stream":
        meta = json.loads(response.headers.get("metadata", "{}"))  # bytes_only: none (float32, native)
        item = meta["data"][0] if meta else {"embed_dtype": "float32", "endianness": "native"}
        order = {"big": ">", "little": "<"}.get(item["endianness"], "=")
        if item["embed_dtype"] == "bfloat16":  # the high half of a float32
            raw = np.frombuffer(response.content, dtype=order + "u2").astype(np.uint32) << 16
            values = raw.view(np.float32).astype(np.float64).tolist()
        else:
            dtype = {"float32": "f4", "float16": "f2"}[item["embed_dtype"]]
            values = np.frombuffer(response.content, dtype=order + dtype).astype(np.float64).tolist()
        kept = {k: v for k, v in meta.items() if k not in ("id", "created")}
        return {"status": response.status_code, "meta": kept, "values": values}
    body = response.json()
    if response.status_code != 200:
        return {"status": response.status_code}
    values: list = []
    _split_numbers(body, values, ("id", "created", "created_at"))
    return {"status": 200, "shape": body, "values": values}


def _split_numbers(body, values: list, dropped: tuple[str, ...]) -> None:
    """Move every float out of ``body`` into ``values``, in place; base64 vectors decoded (Cohere's
    ``base64``: little-endian float32; an embedding's here: fp8, its bytes)."""
    items = body.items() if isinstance(body, dict) else enumerate(body)
    for key, value in list(items):
        if key in dropped:
            body[key] = None
        elif isinstance(value, float):
            values.append(value)
            body[key] = "float"
        elif key == "base64" and isinstance(value, list):
            values.extend(v for item in value for v in np.frombuffer(base64.b64decode(item), "<f4").tolist())
            body[key] = "base64"
        elif key in ("embedding", "data") and isinstance(value, str):
            values.extend(np.frombuffer(base64.b64decode(value), np.uint8).astype(np.float64).tolist())
            body[key] = "base64"
        elif isinstance(value, (dict, list)):
            _split_numbers(value, values, dropped)


def _more_calls(url: str, model: str) -> list[dict]:
    return [_comparable(httpx.post(url + path, json={"model": model, **body}, timeout=60)) for path, body in MORE_CALLS]


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
        "chat_no_role": ("/v1/embeddings", {"model": embed_model, "messages": [{"content": "hi"}]}),
        "embed_dtype": ("/v1/embeddings", {"model": embed_model, "input": "x", "embed_dtype": "float64"}),
        "cohere_input_type": ("/v2/embed", {"model": embed_model, "texts": ["x"], "input_type": "query"}),
        "cohere_none": ("/v2/embed", {"model": embed_model, "texts": ["a b c d"], "truncate": "NONE", "max_tokens": 1}),
        "cohere_empty": ("/v2/embed", {"model": embed_model, "texts": []}),
        "invocations_unplaced": ("/invocations", {"model": embed_model, "prompt": {"a": 1}}),
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
        answers["more"] = _more_calls(url, "tiny-embed")
    gen_args = {"max_model_len": 512, "dtype": "float32", "enforce_eager": True}
    with bare_vllm_server(tiny_llama, "tiny-llama", gen_args, logs / "generate.log") as url:
        body = {"model": "tiny-llama", "input": "x"}
        answers["embed_generative"] = httpx.post(f"{url}/v1/embeddings", json=body, timeout=60).status_code
        answers["invocations_generative"] = _invocations_generative(url)
    return answers


def _invocations_generative(url: str) -> list[tuple[int, str | None, int | None]]:
    """/invocations on the generative model: a completion and a chat (status, object, tokens),
    and the embeddings body it cannot place (status)."""
    bodies = [
        {"model": "tiny-llama", "prompt": "def", "max_tokens": 3, "temperature": 0, "ignore_eos": True},
        {"model": "tiny-llama", "messages": CONVERSATION, "max_tokens": 3, "temperature": 0, "ignore_eos": True},
        {"model": "tiny-llama", "input": "x"},
    ]
    out = []
    for body in bodies:
        r = httpx.post(f"{url}/invocations", json=body, timeout=60)
        ok = r.status_code == 200
        out.append(
            (r.status_code, r.json()["object"] if ok else None, r.json()["usage"]["completion_tokens"] if ok else None)
        )
    return out


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


def test_chat_form_bytes_cohere_and_invocations_equal_bare_vllms(reference, ours):
    for (path, body), mine, theirs in zip(MORE_CALLS, _more_calls(ours, "tiny-embed"), reference["more"], strict=True):
        assert theirs["status"] == 200 and theirs["values"], (path, body)  # numbers to compare
        assert {k: v for k, v in mine.items() if k != "values"} == {k: v for k, v in theirs.items() if k != "values"}, (
            path,
            body,
        )
        np.testing.assert_allclose(np.asarray(mine["values"]), np.asarray(theirs["values"]), rtol=0, atol=ATOL)


def test_invocations_on_the_generative_model(reference, ours):
    assert _invocations_generative(ours) == reference["invocations_generative"]


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
