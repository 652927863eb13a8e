"""The router deployment keeps the runtime LoRA loads and unloads every ingress replica syncs
from: the latest per name, in load order (a reload moves last, as vLLM lists it)."""

from __future__ import annotations

import asyncio

from tests.doubles.router_fakes import make_router


def test_runtime_adapter_changes_are_kept_latest_per_name_in_load_order():
    async def run():
        router, _ = make_router()
        assert await router.lora_adapters() == {}
        await router.set_lora_adapter("a", "/a")
        await router.set_lora_adapter("b", "/b")
        await router.set_lora_adapter("a", None)  # unloaded
        assert await router.lora_adapters() == {"b": "/b", "a": None}
        await router.set_lora_adapter("b", "/b2")  # reloaded from elsewhere: last
        assert list((await router.lora_adapters()).items()) == [("a", None), ("b", "/b2")]

    asyncio.run(run())
