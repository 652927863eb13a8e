"""The LoRA adapters an ingress replica serves: the models' declared ``lora_modules`` plus those
loaded at run time (``/v1/load_lora_adapter``), each served by name on its base model.

Runtime loads and unloads reach every ingress replica through the router deployment, which
keeps the latest per name (``RouterDeployment.lora_adapters``): the replica that takes one
publishes it before answering, and every replica syncs from it (``AdapterSync``: at most every
``ADAPTER_SYNC_S``, only for a ``model`` that names no base model, for ``/v1/models`` and before
a load or unload), so another replica serves a change within that time.

Every engine request with an adapter carries it whole (``accel.contract.LoraAdapter``: name, id,
path), so every replica of the model's LoRA pools runs it, including replicas that start later:
vLLM loads an adapter it has not seen from the request's path (then keeps it among its
``max_cpu_loras``). The set lives here, in the ingress; an unloaded adapter is simply no longer
resolved (vLLM's server forgets it the same way: it sends no remove to its engine).

Adapter ids: vLLM keys an adapter by ``int_id`` inside an engine, so the same name and path must
get the same id from every ingress replica, and two adapters never one id: a stable 31-bit hash
of (name, path), never a per-process counter.

Load and unload answer as vLLM 0.32's ``OpenAIServingModels`` does: the same checks in the same
order, statuses, error types and messages (``LoraAnswer``); the routes are ``lora_routes``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from accel.contract import LoraAdapter
from deployments.config.app import ModelConfig
from deployments.config.lora import adapter_refusal
from deployments.messages.routing import stable_hash64

T = TypeVar("T")
ADAPTER_SYNC_S = 1.0  # how stale an ingress replica's view of other replicas' loads may be

logger = logging.getLogger(__name__)
_ID_SPACE = (1 << 31) - 2  # ids 1 .. 2**31 - 1 (vLLM's are positive ints)


def adapter_id(name: str, path: str) -> int:
    return 1 + stable_hash64(f"{name}\0{path}") % _ID_SPACE


@dataclass(frozen=True)
class ServedAdapter:
    adapter: LoraAdapter
    model: ModelConfig  # the base model it runs on (its ``parent`` in /v1/models)


@dataclass(frozen=True)
class LoraAnswer:
    """What a load/unload answers: 200 with ``message`` as plain text, else vLLM's error body."""

    status: int
    message: str
    error_type: str = ""


class AdapterRegistry:
    """Adapters by served name. Not thread-safe: the ingress's event loop only."""

    def __init__(self, models: Sequence[ModelConfig]) -> None:
        self._models = {m.name: m for m in models}
        # Runtime loads go to the first model that runs adapters (vLLM's server has one base model).
        self._runtime_model = next((m for m in models if any(p.max_loras for p in m.pools)), None)
        self._adapters: dict[str, ServedAdapter] = {}
        for model in models:
            for module in model.lora_modules:
                self._adapters[module.name] = ServedAdapter(self._adapter(module.name, module.path), model)

    def resolve(self, name: str) -> ServedAdapter | None:
        return self._adapters.get(name)

    def lookup_through(self, lookup: Callable[[str | None], T]) -> Callable[[str | None], T]:
        """``lookup`` (a model name -> what it resolves to) taking an adapter's name as its base
        model's: for endpoints where an adapter changes nothing (``/tokenize``, ``/detokenize``:
        vLLM tokenizes an adapter's requests with the base model's tokenizer)."""

        def through(name: str | None) -> T:
            served = self.resolve(name) if name else None
            return lookup(served.model.name if served else name)

        return through

    def served(self) -> tuple[ServedAdapter, ...]:
        """In load order (vLLM lists its adapters after the base models, in load order)."""
        return tuple(self._adapters.values())

    def load(self, lora_name: str, lora_path: str, load_inplace: bool = False) -> LoraAnswer:
        """vLLM's ``load_lora_adapter``: checks, then the adapter served under ``lora_name``."""
        if not lora_name or not lora_path:
            return LoraAnswer(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        if lora_name in self._models:
            return LoraAnswer(
                400, f"The lora adapter '{lora_name}' conflicts with a served base model.", "InvalidUserInput"
            )
        if not load_inplace and lora_name in self._adapters:
            message = (
                f"The lora adapter '{lora_name}' has already been loaded. If you want to load the adapter "
                "in place, set 'load_inplace' to True."
            )
            return LoraAnswer(400, message, "InvalidUserInput")
        model = self._runtime_model
        if model is None:
            return LoraAnswer(500, "LoRA is not enabled: no pool sets engine_args.enable_lora", "InternalServerError")
        if not (Path(lora_path) / "adapter_config.json").is_file():  # what vLLM's worker fails on
            message = f"Loading lora {lora_name} failed: No adapter found for {lora_path}"
            return LoraAnswer(404, message, "NotFoundError")
        # What vLLM's engine refuses as it loads the adapter (rank over max_lora_rank, DoRA, ...).
        refusal = adapter_refusal(lora_path, min(p.max_lora_rank for p in model.pools if p.max_loras))
        if refusal is not None:
            return LoraAnswer(500, refusal, "InternalServerError")
        self._adapters[lora_name] = ServedAdapter(self._adapter(lora_name, lora_path), model)
        return LoraAnswer(200, f"Success: LoRA adapter '{lora_name}' added successfully.")

    def unload(self, lora_name: str) -> LoraAnswer:
        """vLLM's ``unload_lora_adapter``."""
        if not lora_name:
            message = "'lora_name' needs to be provided to unload a LoRA adapter."
            return LoraAnswer(400, message, "InvalidUserInput")
        if lora_name not in self._adapters:
            return LoraAnswer(404, f"The lora adapter '{lora_name}' cannot be found.", "NotFoundError")
        del self._adapters[lora_name]
        return LoraAnswer(200, f"Success: LoRA adapter '{lora_name}' removed successfully.")

    def apply_runtime(self, changes: Mapping[str, str | None]) -> None:
        """The runtime loads (path) and unloads (None) made through every ingress replica, oldest
        first (``RouterDeployment.lora_adapters``)."""
        for name, path in changes.items():
            current = self._adapters.get(name)
            if path is None:
                self._adapters.pop(name, None)
            elif self._runtime_model is not None and name not in self._models:
                if current is None or current.adapter.path != path:
                    self._adapters.pop(name, None)  # (re)loaded: listed last, as vLLM lists it
                    self._adapters[name] = ServedAdapter(self._adapter(name, path), self._runtime_model)

    @staticmethod
    def _adapter(name: str, path: str) -> LoraAdapter:
        return LoraAdapter(name, adapter_id(name, path), path)


class AdapterSync:
    """Keeps an ingress replica's ``AdapterRegistry`` in step with the runtime loads and unloads
    of every ingress replica: ``fetch`` reads them (the router's), ``publish`` records one there.
    A failed fetch leaves the registry as it was (logged at debug: the router may be restarting)."""

    def __init__(
        self,
        registry: AdapterRegistry,
        fetch: Callable[[], Awaitable[Mapping[str, str | None]]],
        publish: Callable[[str, str | None], Awaitable[None]],
        period_s: float = ADAPTER_SYNC_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self._fetch, self._publish = fetch, publish
        self._period_s, self._clock = period_s, clock
        self._synced_at_s: float | None = None

    async def sync(self, force: bool = False) -> None:
        """Fetch and apply, unless the last sync is younger than ``period_s`` (and not ``force``)."""
        now = self._clock()
        if not force and self._synced_at_s is not None and now - self._synced_at_s < self._period_s:
            return
        self._synced_at_s = now
        try:
            changes = await self._fetch()
        except Exception as exc:
            logger.debug("LoRA adapter sync failed: %r", exc)
            return
        self.registry.apply_runtime(changes)

    async def publish(self, name: str, path: str | None) -> None:
        """Record a load (``path``) or unload (None) this replica made, for the others."""
        try:
            await self._publish(name, path)
        except Exception as exc:
            logger.warning("LoRA adapter %r: other ingress replicas not told (%r)", name, exc)
