"""Configuration of the TT mesh engine, spelled as vLLM's engine args.

``TTEngineConfig.from_engine_args`` takes the same keys a vLLM user passes (``max_num_seqs``,
``data_parallel_size``, ``additional_config: {"tt": {...}}``, ...) and refuses, by name, anything
unknown or unsupported on the TT path. Lane semantics: ``data_parallel_size`` is the number of
lanes on the one mesh and ``max_num_seqs`` is the **per-lane** slot count, so the decode batch on
the wire is ``data_parallel_size * max_num_seqs`` rows.

Checks that need the model class (prefix caching, async decode) live in
``check_model_capabilities``, called by the engine once the class is resolved.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from accel.checkpoint import max_position_embeddings
from accel.contract import ConfigError
from accel.tt.mesh_model import SUPPORTS_ASYNC_DECODE, SUPPORTS_PREFIX_CACHING

SAMPLE_ON_DEVICE_MODES = ("all", "decode_only")
TRACE_MODES = ("all", "decode_only", "none")
OPTIMIZATIONS = ("performance", "accuracy")
FABRIC_RELIABILITY_MODES = ("STRICT_INIT", "RELAXED_INIT")
DISPATCH_CORE_AXES = ("row", "col")
# vLLM's ``kv_cache_dtype`` values this engine can store. "auto" = the platform default:
# ``ttnn.bfloat8_b`` on a mesh (what tt-metal's generators allocate), the model dtype in torch.
KV_CACHE_DTYPES = ("auto", "bfloat16", "float32")

# Engine args a vLLM user may pass that we refuse with a reason instead of "unknown key".
_REFUSED_ARGS: dict[str, str] = {
    "speculative_config": "speculative decoding is not supported on the TT mesh engine",
    "enable_lora": "LoRA is not supported on the TT mesh engine",
    "prompt_logprobs": "prompt logprobs are not supported on the TT mesh engine",
    "enable_prompt_logprobs": "prompt logprobs are not supported on the TT mesh engine",
}
# Accepted for drop-in compatibility; they do not change this engine's behaviour.
_IGNORED_ARGS = frozenset({"served_model_name", "trust_remote_code", "dtype", "tokenizer_mode"})


@dataclass(frozen=True)
class TTOptions:
    """``additional_config["tt"]``: the tt-metal platform knobs (vllm-tt-plugin spellings)."""

    sample_on_device_mode: str | None = None  # None = always sample on the host
    trace_mode: str = "all"
    enable_model_warmup: bool = True
    fabric_config: str | None = None  # a ttnn.FabricConfig member name; None = default
    fabric_reliability_mode: str = "STRICT_INIT"
    dispatch_core_axis: str | None = None  # "row" | "col"
    worker_l1_size: int | None = None
    trace_region_size: int | None = None  # bytes; None = 50_000_000 when tracing
    l1_small_size: int | None = None
    always_compat_sampling: bool = False  # force host sampling for every batch
    optimizations: str | None = None  # forwarded to initialize_vllm_model
    # meshserve's own knob (not the plugin's): run the step loop, model and KV in an engine-core
    # process of their own (accel.tt.engine_process), as vLLM runs EngineCore apart from AsyncLLM,
    # so detokenizing and streaming do not share a GIL with the steps. Not with PD KV transfer.
    engine_core_process: bool = False

    def __post_init__(self) -> None:
        _check_choice(
            "additional_config.tt.sample_on_device_mode",
            self.sample_on_device_mode,
            SAMPLE_ON_DEVICE_MODES,
            allow_none=True,
        )
        _check_choice("additional_config.tt.trace_mode", self.trace_mode, TRACE_MODES)
        _check_choice(
            "additional_config.tt.fabric_reliability_mode", self.fabric_reliability_mode, FABRIC_RELIABILITY_MODES
        )
        _check_choice(
            "additional_config.tt.dispatch_core_axis", self.dispatch_core_axis, DISPATCH_CORE_AXES, allow_none=True
        )
        _check_choice("additional_config.tt.optimizations", self.optimizations, OPTIMIZATIONS, allow_none=True)
        for name in ("enable_model_warmup", "always_compat_sampling", "engine_core_process"):
            _check_type(f"additional_config.tt.{name}", getattr(self, name), bool)
        for name in ("worker_l1_size", "trace_region_size", "l1_small_size"):
            value = getattr(self, name)
            if value is not None:
                _check_positive_int(f"additional_config.tt.{name}", value, minimum=0)
        if self.fabric_config is not None:
            _check_type("additional_config.tt.fabric_config", self.fabric_config, str)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> TTOptions:
        if not isinstance(values, Mapping):
            raise ConfigError("additional_config.tt: expected a mapping")
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                raise ConfigError(f"additional_config.tt.{key}: unknown key (known: {', '.join(sorted(known))})")
        return cls(**dict(values))


@dataclass(frozen=True)
class TTEngineConfig:
    """Validated engine configuration. Never mutated; the engine derives run-time values
    (KV block count, eos ids) separately."""

    model: str
    tokenizer: str | None = None
    max_num_seqs: int = 32  # per lane
    max_model_len: int = 2048
    data_parallel_size: int = 1  # lanes on the mesh
    block_size: int = 64
    enable_prefix_caching: bool | None = None  # None = on when the model declares it
    async_scheduling: bool = False
    max_num_batched_tokens: int = 2048  # prefill chunk: tokens per lane per prefill step
    num_gpu_blocks_override: int | None = None  # KV blocks per lane
    kv_cache_dtype: str = "auto"  # one of KV_CACHE_DTYPES (vLLM's spelling)
    seed: int = 0
    tt: TTOptions = field(default_factory=TTOptions)

    def __post_init__(self) -> None:
        _check_type("model", self.model, str)
        if not self.model:
            raise ConfigError("model: must name a checkpoint folder")
        for name in ("max_num_seqs", "max_model_len", "data_parallel_size", "block_size", "max_num_batched_tokens"):
            _check_positive_int(name, getattr(self, name), minimum=1)
        if self.num_gpu_blocks_override is not None:
            _check_positive_int("num_gpu_blocks_override", self.num_gpu_blocks_override, minimum=1)
        _check_positive_int("seed", self.seed, minimum=0)
        _check_choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        if self.enable_prefix_caching is not None:
            _check_type("enable_prefix_caching", self.enable_prefix_caching, bool)
        _check_type("async_scheduling", self.async_scheduling, bool)
        if (
            self.num_gpu_blocks_override is not None
            and self.num_gpu_blocks_override * self.block_size < self.max_model_len
        ):
            raise ConfigError(
                f"num_gpu_blocks_override: {self.num_gpu_blocks_override} blocks of "
                f"{self.block_size} tokens per lane cannot hold one max_model_len "
                f"({self.max_model_len}) sequence"
            )

    @property
    def num_lanes(self) -> int:
        return self.data_parallel_size

    @property
    def max_num_seqs_global(self) -> int:
        """Decode rows on the wire (B_wire): every slot of every lane."""
        return self.data_parallel_size * self.max_num_seqs

    @property
    def max_num_blocks_per_req(self) -> int:
        """Page-table width."""
        return -(-self.max_model_len // self.block_size)

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or self.model

    @classmethod
    def from_engine_args(cls, args: Mapping[str, Any]) -> TTEngineConfig:
        """Build from vLLM-spelled engine args; refuses unknown and unsupported keys by name."""
        values: dict[str, Any] = {}
        known = {f.name for f in fields(cls)} - {"tt"}
        for key, value in args.items():
            if key in _REFUSED_ARGS:
                if value in (None, False, 0):
                    continue
                raise ConfigError(f"{key}: {_REFUSED_ARGS[key]}")
            if key in ("tensor_parallel_size", "pipeline_parallel_size"):
                if value not in (None, 1):
                    raise ConfigError(
                        f"{key}={value}: not supported on a TT mesh; the mesh shape "
                        "expresses it (tensor parallelism happens inside the model "
                        "over the mesh)"
                    )
                continue
            if key == "additional_config":
                values["tt"] = _tt_options(value)
                continue
            if key in _IGNORED_ARGS:
                continue
            if key not in known:
                raise ConfigError(f"{key}: unknown engine arg for the TT mesh engine")
            values[key] = value
        if "model" not in values:
            raise ConfigError("model: required")
        if values.get("max_model_len") is None:
            values.pop("max_model_len", None)
            derived = max_position_embeddings(values["model"])
            if derived is not None:
                values["max_model_len"] = derived
        return cls(**values)


def check_model_capabilities(config: TTEngineConfig, capabilities: Mapping[str, Any]) -> None:
    """Refuse options the resolved model class does not declare (missing key = unsupported)."""
    if config.enable_prefix_caching and not capabilities.get(SUPPORTS_PREFIX_CACHING, False):
        raise ConfigError(
            f"enable_prefix_caching: the model does not declare {SUPPORTS_PREFIX_CACHING} in model_capabilities"
        )
    if config.async_scheduling and not capabilities.get(SUPPORTS_ASYNC_DECODE, False):
        raise ConfigError(f"async_scheduling: the model does not declare {SUPPORTS_ASYNC_DECODE} in model_capabilities")


def _tt_options(additional: Any) -> TTOptions:
    if additional is None:
        return TTOptions()
    if not isinstance(additional, Mapping):
        raise ConfigError("additional_config: expected a mapping")
    for key in additional:
        if key != "tt":
            raise ConfigError(f"additional_config.{key}: unknown key (only 'tt' is read)")
    return TTOptions.from_mapping(additional.get("tt") or {})


def _check_type(name: str, value: Any, kind: type) -> None:
    if not isinstance(value, kind):
        raise ConfigError(f"{name}: expected {kind.__name__}, got {value!r}")


def _check_positive_int(name: str, value: Any, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{name}: expected an integer >= {minimum}, got {value!r}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...], allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value not in choices:
        raise ConfigError(f"{name}: expected one of {', '.join(choices)}, got {value!r}")
