"""HF architecture -> ``TT<arch>`` mesh model class, as vllm-tt-plugin registers them.

Every ``hf_config.architectures[i]`` is looked up with a ``TT`` prefix. An entry names the
tt-metal generator class (``"module:Class"``, loaded only on the TTNN path, where tt-metal's
``models`` package is importable) and, for Llama, Qwen3 and Qwen2.5-VL only, the torch implementation that runs
without a mesh. Sources, in registration order (the first registration of a name wins):

1. ``EXTRA_MODELS_DIR``: each subfolder with a ``vllm_metadata.json`` ``{"arch": "<HF arch>",
   "main_class": "module:Class"}`` is appended to ``sys.path`` and registered as ``TT<arch>``.
   An optional ``"backend": "torch"`` marks a class that runs without hardware (default ``"ttnn"``).
   A malformed bundle is skipped with a warning (as the plugin does).
2. The built-ins below (``builtin_models``: ``TT_LLAMA_TEXT_VER`` / ``TT_QWEN3_TEXT_VER`` /
   ``TT_QWEN35_TEXT_VER`` pick the generator, Gemma 4 under its three architecture names),
   unless ``TT_VLLM_BUILTIN_MODELS=0``.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from accel import envs
from accel.contract import ConfigError
from accel.tt.mesh_model import SUPPORTS_DATA_PARALLEL_LANES, MeshModel
from accel.tt.multimodal import TEXT_ONLY, UPSTREAM_VISION_TRAITS, VisionTraits, vision_traits

logger = logging.getLogger(__name__)

BACKEND_TORCH = "torch"
BACKEND_TTNN = "ttnn"
BACKENDS = (BACKEND_TORCH, BACKEND_TTNN)
TORCH_MESH_MODEL = "accel.tt.torch_model:TorchMeshModel"
TORCH_QWEN25_VL_MODEL = "accel.tt.torch_model.vl_model:TorchQwen25VLMeshModel"
METADATA_FILE = "vllm_metadata.json"

_TT_TRANSFORMERS = "models.tt_transformers.tt.generator_vllm"


@dataclass(frozen=True)
class ModelEntry:
    tt_arch: str  # "TTLlamaForCausalLM"
    ttnn_class: str | None  # "module:Class" of the tt-metal generator
    torch_class: str | None = None  # "module:Class" runnable without a mesh
    source: str = "builtin"  # "builtin" or the EXTRA_MODELS_DIR folder

    def class_path(self, backend: str) -> str | None:
        return self.torch_class if backend == BACKEND_TORCH else self.ttnn_class


_GALAXY = "models.demos.llama3_70b_galaxy.tt.generator_vllm"
_GEMMA4 = "models.demos.gemma4.tt.generator_vllm:Gemma4ForCausalLM"
# vllm-tt-plugin's generator switches: env var -> {value: "module:Class"}; the first is the default.
LLAMA_TEXT_VERSIONS = {
    "tt_transformers": f"{_TT_TRANSFORMERS}:LlamaForCausalLM",
    "llama3_70b_galaxy": f"{_GALAXY}:LlamaForCausalLM",
    "llama2_70b": "models.demos.t3000.llama2_70b.tt.generator_vllm:TtLlamaForCausalLM",
}
QWEN3_TEXT_VERSIONS = {
    "tt_transformers": f"{_TT_TRANSFORMERS}:QwenForCausalLM",
    "qwen3_32b_galaxy": f"{_GALAXY}:QwenForCausalLM",
}
QWEN35_TEXT_VERSIONS = {"qwen36_blackhole": "models.demos.blackhole.qwen36.tt.qwen36_vllm:Qwen36ForCausalLM"}
# Versions served by the single-execute Galaxy generator: for these (and GPT-OSS) the plugin folds
# --data_parallel_size into in-process lanes; every other class runs one process per submesh.
GALAXY_VERSIONS = {"TT_LLAMA_TEXT_VER": "llama3_70b_galaxy", "TT_QWEN3_TEXT_VER": "qwen3_32b_galaxy"}
LANE_DP_CLASS_NAMES = frozenset({"GptOssForCausalLM"})


def _pick(env_var: str, value: str, versions: Mapping[str, str]) -> str:
    if value not in versions:
        raise ConfigError(f"{env_var}={value!r}: unsupported; pick one of {list(versions)}")
    return versions[value]


def builtin_models() -> tuple[ModelEntry, ...]:
    """tt-metal's generator paths as vllm-tt-plugin registers them (``TT_LLAMA_TEXT_VER``,
    ``TT_QWEN3_TEXT_VER``, ``TT_QWEN35_TEXT_VER`` from ``accel.envs``; Gemma 4 under its three
    HF architecture names)."""
    env = envs.ENVS
    llama = _pick("TT_LLAMA_TEXT_VER", env.tt_llama_text_ver, LLAMA_TEXT_VERSIONS)
    qwen3 = _pick("TT_QWEN3_TEXT_VER", env.tt_qwen3_text_ver, QWEN3_TEXT_VERSIONS)
    qwen35 = _pick("TT_QWEN35_TEXT_VER", env.tt_qwen35_text_ver, QWEN35_TEXT_VERSIONS)
    return (
        ModelEntry("TTLlamaForCausalLM", llama, TORCH_MESH_MODEL),
        ModelEntry("TTMllamaForConditionalGeneration", f"{_TT_TRANSFORMERS}:MllamaForConditionalGeneration"),
        ModelEntry("TTQwen2ForCausalLM", f"{_TT_TRANSFORMERS}:QwenForCausalLM"),
        ModelEntry("TTQwen3ForCausalLM", qwen3, TORCH_MESH_MODEL),
        ModelEntry("TTQwen3_5ForConditionalGeneration", qwen35),
        ModelEntry(
            "TTQwen2_5_VLForConditionalGeneration",
            "models.demos.qwen25_vl.tt.generator_vllm:Qwen2_5_VLForConditionalGeneration",
            TORCH_QWEN25_VL_MODEL,
        ),
        ModelEntry(
            "TTQwen3VLForConditionalGeneration",
            "models.demos.qwen3_vl.tt.generator_vllm:Qwen3VLForConditionalGeneration",
        ),
        ModelEntry("TTMistralForCausalLM", f"{_TT_TRANSFORMERS}:MistralForCausalLM"),
        ModelEntry("TTMistral3ForConditionalGeneration", f"{_TT_TRANSFORMERS}:Mistral3ForConditionalGeneration"),
        ModelEntry("TTGemma3ForConditionalGeneration", f"{_TT_TRANSFORMERS}:Gemma3ForConditionalGeneration"),
        ModelEntry("TTGemma4ForCausalLM", _GEMMA4),
        ModelEntry("TTGemma4ForConditionalGeneration", _GEMMA4),
        ModelEntry("TTGemma4UnifiedForConditionalGeneration", _GEMMA4),
        ModelEntry("TTDeepseekV3ForCausalLM", "models.demos.deepseek_v3.tt.generator_vllm:DeepseekV3ForCausalLM"),
        ModelEntry("TTGptOssForCausalLM", f"{_TT_TRANSFORMERS}:GptOssForCausalLM"),
    )


def folds_dp_into_lanes(model_cls: type) -> bool:
    """Whether ``data_parallel_size`` may become in-process lanes for ``model_cls``: the class
    declares ``supports_data_parallel_lanes`` (our torch programs), a Galaxy generator version is
    selected, or it is GPT-OSS (vllm-tt-plugin ``_model_folds_dp_into_lanes``)."""
    caps = getattr(model_cls, "model_capabilities", None) or {}
    if caps.get(SUPPORTS_DATA_PARALLEL_LANES, False):
        return True
    env = envs.ENVS
    if env.tt_llama_text_ver == GALAXY_VERSIONS["TT_LLAMA_TEXT_VER"]:
        return True
    if env.tt_qwen3_text_ver == GALAXY_VERSIONS["TT_QWEN3_TEXT_VER"]:
        return True
    return getattr(model_cls, "__name__", None) in LANE_DP_CLASS_NAMES


def tt_arch_name(arch: str) -> str:
    return arch if arch.startswith("TT") else "TT" + arch


class ModelRegistry:
    def __init__(self, entries: Iterable[ModelEntry] = ()) -> None:
        self._entries: dict[str, ModelEntry] = {}
        for entry in entries:
            self.register(entry)

    def register(self, entry: ModelEntry) -> bool:
        """Adds ``entry`` unless its name is taken (first registration wins, like the plugin)."""
        if entry.tt_arch in self._entries:
            return False
        self._entries[entry.tt_arch] = entry
        return True

    def names(self) -> list[str]:
        return sorted(self._entries)

    def get(self, tt_arch: str) -> ModelEntry | None:
        return self._entries.get(tt_arch)

    def resolve_entry(self, hf_config: Any) -> ModelEntry:
        archs = list(getattr(hf_config, "architectures", None) or [])
        for arch in archs:
            entry = self._entries.get(tt_arch_name(arch))
            if entry is not None:
                return entry
        raise ConfigError(
            f"no TT model registered for architectures {archs} "
            f"(looked up {[tt_arch_name(a) for a in archs]}; registered: {self.names()})"
        )

    def resolve(self, hf_config: Any, backend: str) -> type[MeshModel]:
        if backend not in BACKENDS:
            raise ConfigError(f"unknown mesh backend {backend!r}; expected one of {BACKENDS}")
        entry = self.resolve_entry(hf_config)
        path = entry.class_path(backend)
        if path is None:
            raise ConfigError(
                f"{entry.tt_arch} needs a Tenstorrent mesh (ttnn): it has no torch "
                "implementation; only Llama, Qwen3 and Qwen2.5-VL run without TT hardware"
            )
        return load_class(path)


def load_class(path: str) -> type[MeshModel]:
    """The class ``"module:Class"`` names; a registered class implements tt-metal's model-class
    contract (``MeshModel``; a ttnn one behind ``TtnnMeshModel``), which its calls check."""
    module_name, _, class_name = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load mesh model class {path!r}: {exc}") from exc
    if not isinstance(cls, type):
        raise ConfigError(f"mesh model {path!r} is not a class")
    return cast("type[MeshModel]", cls)


def extra_model_entries(extra_models_dir: str | Path) -> list[ModelEntry]:
    """Entries from ``EXTRA_MODELS_DIR`` subfolders (sorted); each folder is put on ``sys.path``.
    Like vllm-tt-plugin: a path that is not a directory is ignored and a malformed bundle
    skipped, each with a warning naming it (one bad bundle must not take the others down)."""
    root = Path(extra_models_dir)
    if not root.is_dir():
        logger.warning("EXTRA_MODELS_DIR=%s is not a directory; ignoring it", root)
        return []
    entries = []
    for folder in sorted(p for p in root.iterdir() if (p / METADATA_FILE).is_file()):
        try:
            meta = _read_metadata(folder / METADATA_FILE)
        except ConfigError as exc:
            logger.warning("skipping EXTRA_MODELS_DIR bundle %s: %s", folder, exc)
            continue
        backend = meta.get("backend", BACKEND_TTNN)
        if backend not in BACKENDS:
            logger.warning("skipping %s: backend must be one of %s, got %r", folder / METADATA_FILE, BACKENDS, backend)
            continue
        if str(folder) not in sys.path:
            sys.path.append(str(folder))
        main_class = meta["main_class"]
        entries.append(
            ModelEntry(
                tt_arch_name(meta["arch"]),
                ttnn_class=main_class if backend == BACKEND_TTNN else None,
                torch_class=main_class if backend == BACKEND_TORCH else None,
                source=str(folder),
            )
        )
        logger.info("registered %s -> %s (%s, from %s)", entries[-1].tt_arch, main_class, backend, folder.name)
    return entries


def _read_metadata(path: Path) -> Mapping[str, Any]:
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(meta, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    for key in ("arch", "main_class"):
        if not isinstance(meta.get(key), str) or not meta[key]:
            raise ConfigError(f"{path}: missing string field {key!r}")
    if ":" not in meta["main_class"]:
        raise ConfigError(f"{path}: main_class must be 'module:Class', got {meta['main_class']!r}")
    return meta


def build_registry(extra_models_dir: str | Path | None = None, include_builtins: bool | None = None) -> ModelRegistry:
    """Defaults come from ``accel.envs`` (``EXTRA_MODELS_DIR``, ``TT_VLLM_BUILTIN_MODELS``)."""
    extra = envs.ENVS.extra_models_dir if extra_models_dir is None else extra_models_dir
    builtins = envs.ENVS.tt_builtin_models if include_builtins is None else include_builtins
    registry = ModelRegistry(extra_model_entries(extra) if extra else ())
    if builtins:
        for entry in builtin_models():
            registry.register(entry)
    return registry


def checkpoint_vision_traits(hf_config: Any, backend: str, registry: ModelRegistry | None = None) -> VisionTraits:
    """What the class serving ``hf_config`` on ``backend`` takes in images, without building it
    (for whoever decides whether a TT pool accepts images): a torch class or an
    ``EXTRA_MODELS_DIR`` bundle is imported and read (``vision_traits``); a tt-metal generator is
    known by its class name only (importing it needs tt-metal, ttnn and vLLM). Text-only when
    nothing serves the architecture on ``backend``."""
    registry = registry or build_registry()
    try:
        entry = registry.resolve_entry(hf_config)
    except ConfigError:
        return TEXT_ONLY
    path = entry.class_path(backend)
    if path is None:
        return TEXT_ONLY
    if backend == BACKEND_TORCH or entry.source != "builtin":
        return vision_traits(load_class(path))
    return UPSTREAM_VISION_TRAITS.get(path.partition(":")[2], TEXT_ONLY)


def resolve_model_class(hf_config: Any, backend: str, registry: ModelRegistry | None = None) -> type[MeshModel]:
    """The ``MeshModel`` class for ``hf_config`` on ``backend`` (``"torch"`` or ``"ttnn"``).

    Raises ``ConfigError`` naming the architecture when nothing is registered for it, or when it
    has no implementation for ``backend`` (e.g. Gemma3 off-hardware: needs a Tenstorrent mesh)."""
    return (registry or build_registry()).resolve(hf_config, backend)
