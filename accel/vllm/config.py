"""Engine args for a TPU slice replica, spelled and passed through as vLLM spells them.

``VllmEngineConfig.from_engine_args({...})`` takes every key ``vllm serve`` 0.32 takes, spelled as
vLLM spells them and checked by vLLM's own argument parser (``accel.vllm.engine_arg_parser``; an
unknown or ill-typed key raises ``ConfigError`` naming it). The keys meshserve itself reads are
typed fields below; the rest travel untouched in ``extra_args`` to ``AsyncEngineArgs`` (e.g.
``speculative_config``, ``enable_lora``, ``max_loras``, ``compilation_config``). A value left
``None`` is not passed, so vLLM's own default applies. ``tensor_parallel_size`` left unset
means "every chip of the slice" on TPU, and 1 on the CPU stand-in (``accel.vllm.platform``).

Compile cache. tpu-inference compiles one XLA program per padded batch/sequence bucket at start,
which takes minutes on big models; it persists them in JAX's compilation cache at
``VLLM_XLA_CACHE_PATH``. We set that per model (``<MESHSERVE_XLA_CACHE_DIR>/<model slug>``) so a
restarted replica reuses its compiled graphs instead of sharing one folder between models.

Multi-host slices. One vLLM engine drives the whole slice; its workers are Ray actors, one per
TPU host, inside the replica's placement group:

1. The replica owns a slice placement group: Serve's (static placement: bundle i = host i,
   the replica actor in bundle 0) or one it reserved with ``create_slice_placement_group``
   (deferred placement; see ``accel.vllm.tpu.placement``).
2. ``engine_args()`` sets ``distributed_executor_backend="ray"`` and the engine environment
   sets ``TPU_MULTIHOST_BACKEND=ray``, which makes tpu-inference use vLLM's Ray executor with one
   worker per host (bundle ``{"TPU": chips_per_host}``) instead of its single-process executor.
3. The replica builds the ``VllmConfig`` and sets ``parallel_config.placement_group`` to the
   slice group before constructing ``AsyncLLM`` (``VllmEngine`` does it). vLLM's
   ``initialize_ray_cluster`` reuses a group set there (or the caller's current group) rather
   than creating a nested one, the failure mode of vllm#29688.
4. Environment for the workers (``VLLM_XLA_CACHE_PATH``, ``JAX_PLATFORMS``...) travels with
   vLLM's Ray executor, which copies the ``VLLM_*``/platform variables to its workers.
TP defaults to all chips of the slice (JAX SPMD over every host); DP/EP as given.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from accel import envs
from accel.contract import ConfigError
from accel.vllm.engine_arg_parser import canonical_key, parse_engine_args
from accel.vllm.tpu.topology import SliceTopology

_INT_KEYS = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "seed",
    "kv_cache_memory_bytes",
    "max_logprobs",
)
_BOOL_KEYS = (
    "enable_expert_parallel",
    "enable_prefix_caching",
    "async_scheduling",
    "enforce_eager",
    "trust_remote_code",
    "enable_chunked_prefill",
    "disable_hybrid_kv_cache_manager",
    "disable_log_stats",
    "enable_log_requests",
)
_STR_KEYS = (
    "model",
    "tokenizer",
    "kv_cache_dtype",
    "dtype",
    "load_format",
    "quantization",
    "revision",
    "served_model_name",
    "distributed_executor_backend",
    "reasoning_parser",
)
_MAPPING_KEYS = (
    "additional_config",
    "kv_transfer_config",
    "kv_events_config",
    "hf_overrides",
    "structured_outputs_config",
    "extra_args",
)
# Fields that are not engine args themselves.
_NOT_ENGINE_ARGS = ("xla_cache_root", "extra_args")


@dataclass(frozen=True)
class VllmEngineConfig:
    """vLLM engine args of one slice replica (``None``: vLLM's default), plus where compiled
    graphs are cached. Mappings are copied on construction; treat them as read-only."""

    model: str
    tokenizer: str | None = None
    tensor_parallel_size: int | None = None  # None: all chips of the slice (TPU), 1 (CPU)
    pipeline_parallel_size: int | None = None
    data_parallel_size: int | None = None
    enable_expert_parallel: bool | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_dtype: str | None = None
    enable_prefix_caching: bool | None = None
    async_scheduling: bool | None = None
    additional_config: Mapping[str, Any] | None = None
    block_size: int | None = None
    dtype: str | None = None
    enforce_eager: bool | None = None
    seed: int | None = None
    kv_transfer_config: Mapping[str, Any] | None = None
    kv_events_config: Mapping[str, Any] | None = None  # vLLM's KV cache event publisher (ZMQ)
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None
    load_format: str | None = None
    quantization: str | None = None
    revision: str | None = None
    trust_remote_code: bool | None = None
    served_model_name: str | None = None
    enable_chunked_prefill: bool | None = None
    disable_hybrid_kv_cache_manager: bool | None = None
    hf_overrides: Mapping[str, Any] | None = None
    max_logprobs: int | None = None
    distributed_executor_backend: str | None = None
    disable_log_stats: bool | None = None
    # vLLM's StructuredOutputsConfig as a mapping (backend, disable_any_whitespace, reasoning_parser, ...)
    structured_outputs_config: Mapping[str, Any] | None = None
    enable_log_requests: bool | None = None
    # Structured outputs start after the reasoning this parser finds ends (the ingress sets it
    # from the model's reasoning_parser, as ``vllm serve --reasoning-parser`` does).
    reasoning_parser: str | None = None
    # Every other engine arg vLLM accepts (checked by vLLM's parser when vLLM is importable here),
    # as the config spells it; vLLM's parser types them for AsyncEngineArgs in the replica.
    extra_args: Mapping[str, Any] | None = None
    # Not a vLLM arg: the root under which each model gets its compile-cache folder.
    xla_cache_root: Path | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name in _INT_KEYS:
            _check(name, getattr(self, name), lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")
        for name in _BOOL_KEYS:
            _check(name, getattr(self, name), lambda v: isinstance(v, bool), "true or false")
        for name in _STR_KEYS:
            _check(name, getattr(self, name), lambda v: isinstance(v, str) and v != "", "a non-empty string")
        for name in _MAPPING_KEYS:
            value = getattr(self, name)
            _check(name, value, lambda v: isinstance(v, Mapping), "a mapping")
            if value is not None:
                object.__setattr__(self, name, dict(value))
        _check(
            "gpu_memory_utilization",
            self.gpu_memory_utilization,
            lambda v: isinstance(v, (int, float)) and 0 < v <= 1,
            "a number in (0, 1]",
        )
        for name in (
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "data_parallel_size",
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "block_size",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name}: must be >= 1, got {value}")

    @classmethod
    def from_engine_args(cls, args: Mapping[str, Any], *, xla_cache_root: Path | None = None) -> VllmEngineConfig:
        """Build from vLLM-spelled engine args (``max_num_seqs`` or ``max-num-seqs``); a key or
        value vLLM's own parser refuses raises ``ConfigError`` naming the key."""
        args = {canonical_key(key): value for key, value in args.items()}
        if "model" not in args:
            raise ConfigError("model: missing (a checkpoint folder or model id)")
        parse_engine_args(args)  # vLLM's verdict on every key (None: vLLM not importable here)
        typed = {f.name for f in fields(cls)} - set(_NOT_ENGINE_ARGS)
        extra = {key: value for key, value in args.items() if key not in typed}
        known = {key: value for key, value in args.items() if key in typed}
        return cls(**known, extra_args=extra or None, xla_cache_root=xla_cache_root)

    @property
    def xla_cache_path(self) -> Path:
        """``VLLM_XLA_CACHE_PATH`` for this model: stable across restarts, distinct per model."""
        root = self.xla_cache_root or envs.ENVS.xla_cache_dir
        return root / model_slug(self.model)

    def engine_args(self, slice_: SliceTopology | None, tensor_parallel_size: int) -> dict[str, Any]:
        """Keyword args for ``AsyncEngineArgs``: every value set here, with the platform's TP.

        ``tensor_parallel_size`` is the effective TP (``platform.effective_tensor_parallel_size``);
        a multi-host slice gets vLLM's Ray executor unless another backend was asked for.
        """
        out = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in _NOT_ENGINE_ARGS and getattr(self, f.name) is not None
        }
        out["tensor_parallel_size"] = tensor_parallel_size
        if slice_ is not None and slice_.is_multi_host and tensor_parallel_size > 1:
            out.setdefault("distributed_executor_backend", "ray")
        for name in _MAPPING_KEYS:
            if name in out:
                out[name] = dict(out[name])
        if self.extra_args:
            # vLLM's parser types them (JSON configs to config objects), as for `vllm serve`.
            out.update(parse_engine_args(self.extra_args) or self.extra_args)
        return out


def model_slug(model: str) -> str:
    """A folder name for ``model``: readable tail plus a short hash of the full name/path."""
    tail = re.sub(r"[^A-Za-z0-9._-]+", "-", model.rstrip("/").split("/")[-1]) or "model"
    return f"{tail}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"


def _check(name: str, value: Any, ok: Callable[[Any], bool], expected: str) -> None:
    if value is not None and not ok(value):
        raise ConfigError(f"{name}: expected {expected}, got {value!r}")
