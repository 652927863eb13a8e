"""LoRA adapters a model serves, declared as ``vllm serve --lora-modules`` declares them, and what
a pool's engine can run of them.

A model's ``lora_modules`` entries take vLLM's two spellings (``LoRAParserAction``): the old
``name=path`` string, or the JSON form ``{"name", "path", "base_model_name"}`` (as a JSON string,
or as a YAML mapping, which is the same object). Each adapter is served under its own ``name``
(the OpenAI ``model`` field) and listed in ``/v1/models`` with its model as ``parent`` and its
path as ``root``, as vLLM 0.32 lists it.

A pool runs adapters when its vLLM engine args set ``enable_lora`` (at most ``max_loras`` of
them in one batch, vLLM's default 1); TT pools run none (the plugin rejects LoRA).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from accel.contract import ConfigError
from accel.tt.config import TTEngineConfig
from accel.vllm.config import VllmEngineConfig

VLLM_DEFAULT_MAX_LORAS = 1  # vllm.config.LoRAConfig.max_loras
VLLM_DEFAULT_MAX_LORA_RANK = 16  # vllm.config.LoRAConfig.max_lora_rank


@dataclass(frozen=True)
class LoraModule:
    """One declared adapter: ``path`` a PEFT folder (``adapter_config.json`` + weights) on every
    node running the model's LoRA pools. ``base_model_name`` as given (vLLM's JSON form); the
    adapter's parent is always the model it is declared under."""

    name: str
    path: str
    base_model_name: str | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.path:
            raise ConfigError(f"a LoRA module needs a name and a path, got name={self.name!r} path={self.path!r}")


def parse_lora_module(item: str | Mapping[str, object]) -> LoraModule:
    """One ``--lora-modules`` value, as vLLM's parser reads it (raises ``ConfigError``)."""
    if isinstance(item, str) and "=" in item and "," not in item:
        name, path = item.split("=", 1)
        return LoraModule(name, str(Path(path).expanduser()))
    if isinstance(item, str):
        try:
            item = json.loads(item)
        except json.JSONDecodeError:
            raise ConfigError(f"Invalid JSON format for --lora-modules: {item}") from None
    if not isinstance(item, Mapping):
        raise ConfigError(f"Invalid fields for --lora-modules: {item!r}")
    unknown = set(item) - {"name", "path", "base_model_name", "is_3d_lora_weight"}
    if unknown or not isinstance(item.get("name"), str) or not isinstance(item.get("path"), str):
        message = f"{dict(item)!r} (name and path strings; unknown keys {sorted(unknown)})"
        raise ConfigError(f"Invalid fields for --lora-modules: {message}")
    base = item.get("base_model_name")
    return LoraModule(str(item["name"]), str(Path(str(item["path"])).expanduser()), None if base is None else str(base))


def pool_max_loras(engine_config: TTEngineConfig | VllmEngineConfig) -> int:
    """Adapters a replica of this pool runs in one batch; 0 = it runs none."""
    if isinstance(engine_config, TTEngineConfig):
        return 0
    extra = engine_config.extra_args or {}
    if not extra.get("enable_lora"):
        return 0
    return int(extra.get("max_loras") or VLLM_DEFAULT_MAX_LORAS)


def pool_max_lora_rank(engine_config: TTEngineConfig | VllmEngineConfig) -> int:
    """The largest adapter rank a LoRA pool's engine takes (vLLM's ``max_lora_rank``)."""
    extra = engine_config.extra_args if isinstance(engine_config, VllmEngineConfig) else None
    return int((extra or {}).get("max_lora_rank") or VLLM_DEFAULT_MAX_LORA_RANK)


def check_adapter_folder(path: str) -> str | None:
    """Why ``path`` is no PEFT adapter folder vLLM can load (None: it looks like one)."""
    folder = Path(path)
    if not (folder / "adapter_config.json").is_file():
        return f"{folder} has no adapter_config.json (a PEFT adapter folder)"
    return None


def adapter_refusal(path: str, max_lora_rank: int) -> str | None:
    """What vLLM's engine raises when it loads the adapter at ``path`` (an existing PEFT folder)
    with ``max_lora_rank`` (its ``PEFTHelper.validate_legal``: rank, DoRA, bias, ...); None: legal."""
    # deferred: vLLM's LoRA helpers, in the processes that check adapters (config load, ingress)
    from vllm.config.lora import LoRAConfig
    from vllm.lora.peft_helper import PEFTHelper

    try:
        PEFTHelper.from_local_dir(path, None).validate_legal(LoRAConfig(max_lora_rank=max_lora_rank))  # type: ignore[arg-type]
    except (ValueError, TypeError, KeyError) as exc:
        return str(exc)
    return None


def resolve_lora_modules(
    values: list[str | dict[str, object]], model: str, max_loras: list[int], max_lora_rank: int
) -> tuple[LoraModule, ...]:
    """A model's ``lora_modules`` (raises ``ConfigError``): each parsed, names unique, each folder
    an adapter its LoRA pools can load (``max_lora_rank``: the smallest of theirs), and some pool
    of the model (``max_loras``: each pool's ``pool_max_loras``) able to run them (a ``vllm
    serve`` with such a module fails at start)."""
    modules = tuple(parse_lora_module(v) for v in values)
    if modules and not any(max_loras):
        raise ConfigError(f"model {model!r} declares LoRA modules but none of its pools sets engine_args.enable_lora")
    names = [m.name for m in modules]
    for i, module in enumerate(modules):
        if names.index(module.name) != i:
            raise ConfigError(f"duplicate LoRA module name {module.name!r}")
        if module.name == model:
            raise ConfigError(f"LoRA module {module.name!r} conflicts with the served base model")
        problem = check_adapter_folder(module.path) or adapter_refusal(module.path, max_lora_rank)
        if problem is not None:
            raise ConfigError(f"LoRA module {module.name!r}: {problem}")
    return modules
