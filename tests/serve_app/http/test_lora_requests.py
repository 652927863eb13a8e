"""The ingress with LoRA adapters (configs/lora.yaml, no Ray: the engine call recorded):
``model: <adapter>`` runs on the base model with the adapter on every engine request, routed with
``RouteRequest.lora`` and prefix hashes rooted at the adapter, and answered under the adapter's
name; a pin to the TT pool is a 400 naming ``model``; ``/v1/models`` lists the adapters; the
runtime routes exist only with vLLM's opt-in."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.requests import Request

from accel.block_hash import hash_prompt_blocks, salted_root
from accel.contract import FinishReason, GenerateRequest, OutputDelta
from deployments.config.load import load_app_config
from deployments.messages.routing import RouteRequest
from serve_app.http.engine_client import BY_ROUTER, Placement
from serve_app.http.openai_ingress import OpenAIIngress
from serve_app.http.pipeline.endpoints import CHAT

CONFIG = Path(__file__).parents[3] / "configs" / "lora.yaml"
LONG = "The quick brown fox jumps over the lazy dog. " * 12


def _ingress(
    monkeypatch, allow_updates: bool = False
) -> tuple[OpenAIIngress, list[tuple[GenerateRequest, RouteRequest]]]:
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "true" if allow_updates else "0")
    args = yaml.safe_load(CONFIG.read_text())["applications"][0]["args"]
    ingress = OpenAIIngress(load_app_config(args), router_handle=None, pool_handles={})
    seen: list[tuple[GenerateRequest, RouteRequest]] = []

    async def stream(
        request: GenerateRequest, route: RouteRequest, placed: Any = None, placement: Placement = BY_ROUTER
    ) -> AsyncGenerator[OutputDelta, None]:
        seen.append((request, route))
        yield OutputDelta(
            request.request_id, (5,), "x", request.num_prompt_tokens, 1, finish_reason=FinishReason.LENGTH
        )

    ingress._client.stream = stream  # type: ignore[method-assign]
    return ingress, seen


class Running:
    """A pool client whose pool has a running replica."""

    def running_replicas(self) -> frozenset[str]:
        return frozenset({"r"})


def _request(path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Request:
    payload = json.dumps(body).encode()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": payload, "more_body": False}

    raw = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    return Request({"type": "http", "method": "POST", "path": path, "headers": raw}, receive)


def _chat(ingress: OpenAIIngress, model: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    body = {"model": model, "messages": [{"role": "user", "content": LONG}], "max_tokens": 1}
    response = asyncio.run(ingress._run(_request("/v1/chat/completions", body, headers), CHAT))
    return response.status_code, json.loads(response.body)


def test_an_adapter_request_carries_its_adapter_to_the_engine_and_the_router(monkeypatch, tiny_lora_adapters):
    ingress, seen = _ingress(monkeypatch)
    status, body = _chat(ingress, "tiny-llama-lora-b")
    assert status == 200 and body["model"] == "tiny-llama-lora-b"
    [(request, route)] = seen
    assert request.lora is not None and (request.lora.name, request.lora.path) == (
        "tiny-llama-lora-b",
        str(tiny_lora_adapters[1]),
    )
    assert (route.model, route.lora) == ("tiny-llama", "tiny-llama-lora-b")
    root = salted_root(None, "tiny-llama-lora-b")
    block_size = ingress._models["tiny-llama"].routing_block_size
    expected = tuple(hash_prompt_blocks(request.prompt_token_ids, block_size, root))
    assert route.prompt_block_hashes == expected and len(expected) > 1
    status, body = _chat(ingress, "tiny-llama")  # the base model: no adapter, the plain root
    assert status == 200 and body["model"] == "tiny-llama"
    assert seen[1][0].lora is None and seen[1][1].lora is None


def test_an_adapter_pinned_to_the_tt_pool_is_a_400_naming_model(monkeypatch, tiny_lora_adapters):
    ingress, seen = _ingress(monkeypatch)
    status, body = _chat(ingress, "tiny-llama-lora-a", {"x-meshserve-pool": "tt"})
    assert (status, body["error"]["param"]) == (400, "model") and not seen
    assert _chat(ingress, "tiny-llama-lora-a", {"x-meshserve-pool": "vllm"})[0] == 200
    assert _chat(ingress, "no-such-adapter")[0] == 404


def test_models_lists_the_adapters_after_the_base_model(monkeypatch, tiny_lora_adapters):
    ingress, _ = _ingress(monkeypatch)
    ingress._client._engines = {"tt": Running(), "vllm": Running()}  # both pools have a replica
    cards = json.loads(asyncio.run(ingress.models()).body)["data"]
    assert [(c["id"], c["parent"]) for c in cards] == [
        ("tiny-llama", None),
        ("tiny-llama-lora-a", "tiny-llama"),
        ("tiny-llama-lora-b", "tiny-llama"),
    ]
    assert cards[1]["root"] == str(tiny_lora_adapters[0])


@pytest.mark.parametrize("allowed", [False, True])
def test_runtime_updates_only_with_vllms_opt_in(monkeypatch, tiny_lora_adapters, allowed):
    ingress, seen = _ingress(monkeypatch, allow_updates=allowed)
    body = {"lora_name": "c", "lora_path": str(tiny_lora_adapters[0])}
    loaded = asyncio.run(ingress.load_lora_adapter(_request("/v1/load_lora_adapter", body)))
    assert loaded.status_code == (200 if allowed else 404)
    assert _chat(ingress, "c")[0] == (200 if allowed else 404)
    if allowed:
        assert seen[0][0].lora is not None and seen[0][0].lora.path == str(tiny_lora_adapters[0])
        gone = asyncio.run(ingress.unload_lora_adapter(_request("/v1/unload_lora_adapter", {"lora_name": "c"})))
        assert gone.status_code == 200 and _chat(ingress, "c")[0] == 404


def test_tokenize_takes_an_adapters_name_with_its_base_models_tokenizer(monkeypatch, tiny_lora_adapters):
    ingress, _ = _ingress(monkeypatch)

    def tokens(model: str) -> tuple[int, Any]:
        response = asyncio.run(ingress.tokenize(_request("/tokenize", {"model": model, "prompt": LONG})))
        return response.status_code, json.loads(response.body).get("tokens")

    base = tokens("tiny-llama")
    assert base[0] == 200 and tokens("tiny-llama-lora-a") == base
    assert tokens("no-such-adapter")[0] == 404
