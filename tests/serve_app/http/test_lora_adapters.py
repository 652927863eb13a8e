"""AdapterRegistry: the declared adapters resolve to (adapter, base model) with ids stable across
processes; runtime load and unload answer vLLM 0.32's statuses, types and messages, in its order
of checks."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from deployments.config.load import load_app_config
from serve_app.http.lora_adapters import AdapterRegistry, AdapterSync, adapter_id

CONFIG = Path(__file__).parents[3] / "configs" / "lora.yaml"


def _registry() -> AdapterRegistry:
    args = yaml.safe_load(CONFIG.read_text())["applications"][0]["args"]
    return AdapterRegistry(load_app_config(args).models)


def test_declared_adapters_resolve_on_their_model(tiny_lora_adapters):
    registry = _registry()
    served = registry.resolve("tiny-llama-lora-a")
    assert served is not None and served.model.name == "tiny-llama"
    assert (served.adapter.name, served.adapter.path) == ("tiny-llama-lora-a", str(tiny_lora_adapters[0]))
    assert [s.adapter.name for s in registry.served()] == ["tiny-llama-lora-a", "tiny-llama-lora-b"]
    assert registry.resolve("tiny-llama") is None
    ids = {s.adapter.int_id for s in registry.served()}
    assert len(ids) == 2 and all(0 < i < 2**31 for i in ids)


def test_adapter_ids_agree_across_processes():
    code = "from serve_app.http.lora_adapters import adapter_id; print(adapter_id('a', '/p'))"
    env = dict(os.environ, PYTHONHASHSEED="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout
    assert int(out) == adapter_id("a", "/p") != adapter_id("a", "/q")


def test_load_and_unload_answer_as_vllm(tiny_lora_adapters):
    registry = _registry()
    path = str(tiny_lora_adapters[0])
    ok = registry.load("c", path)
    assert (ok.status, ok.message) == (200, "Success: LoRA adapter 'c' added successfully.")
    served = registry.resolve("c")
    assert served is not None and served.adapter.path == path and served.model.name == "tiny-llama"
    again = registry.load("c", path)
    assert (again.status, again.error_type) == (400, "InvalidUserInput")
    assert again.message.startswith("The lora adapter 'c' has already been loaded.")
    assert registry.load("c", str(tiny_lora_adapters[1]), load_inplace=True).status == 200
    assert (
        registry.load("tiny-llama", path).message == "The lora adapter 'tiny-llama' conflicts with a served base model."
    )
    assert registry.load("", path).status == 400
    missing = registry.load("d", "/nonexistent")
    assert (missing.status, missing.error_type) == (404, "NotFoundError")
    assert missing.message == "Loading lora d failed: No adapter found for /nonexistent"
    assert registry.resolve("d") is None
    gone = registry.unload("c")
    assert (gone.status, gone.message) == (200, "Success: LoRA adapter 'c' removed successfully.")
    assert registry.resolve("c") is None
    unknown = registry.unload("c")
    assert (unknown.status, unknown.message) == (404, "The lora adapter 'c' cannot be found.")
    assert registry.unload("").status == 400


def test_an_adapter_the_engine_would_refuse_is_not_loaded(tiny_lora_adapters, tmp_path):
    """Rank over the pool's max_lora_rank (8 in configs/lora.yaml): vLLM's engine raises as it
    loads it, and vLLM's server answers 500 with the reason."""
    config = json.loads((tiny_lora_adapters[0] / "adapter_config.json").read_text())
    (tmp_path / "adapter_config.json").write_text(json.dumps({**config, "r": 16}))
    answer = _registry().load("big", str(tmp_path))
    assert (answer.status, answer.error_type) == (500, "InternalServerError")
    assert "LoRA rank 16 is greater than max_lora_rank 8." in answer.message


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_runtime_changes_of_other_ingress_replicas_are_applied_in_order(tiny_lora_adapters):
    registry = _registry()
    a, b = (str(p) for p in tiny_lora_adapters)
    registry.apply_runtime({"c": a, "tiny-llama-lora-a": None, "tiny-llama": b})
    names = [s.adapter.name for s in registry.served()]
    assert names == ["tiny-llama-lora-b", "c"]  # a unloaded elsewhere; a base model name ignored
    registry.apply_runtime({"c": b})  # reloaded elsewhere from another folder: listed last, new id
    served = registry.resolve("c")
    assert served is not None and served.adapter.path == b and served.adapter.int_id == adapter_id("c", b)


def test_adapter_sync_fetches_at_most_once_a_period_and_survives_a_failing_router(tiny_lora_adapters):
    registry, clock, fetched, published = _registry(), Clock(), [], []
    state: dict[str, str | None] = {"c": str(tiny_lora_adapters[0])}

    async def fetch():
        fetched.append(clock.now_s)
        if state is None:
            raise TimeoutError
        return dict(state)

    async def publish(name, path):
        published.append((name, path))

    sync = AdapterSync(registry, fetch, publish, period_s=1.0, clock=clock)
    asyncio.run(sync.sync())
    asyncio.run(sync.sync())  # within the period: no fetch
    assert fetched == [0.0] and registry.resolve("c") is not None
    state["c"] = None
    clock.now_s = 1.5
    asyncio.run(sync.sync())
    assert fetched == [0.0, 1.5] and registry.resolve("c") is None
    state = None  # the router gone: the registry stays as it was
    asyncio.run(sync.sync(force=True))
    assert len(fetched) == 3 and registry.resolve("tiny-llama-lora-a") is not None
    asyncio.run(sync.publish("d", "/p"))
    assert published == [("d", "/p")]
