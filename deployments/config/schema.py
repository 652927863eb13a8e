"""The YAML ``args`` schema of the application, as pydantic models (the edge only).

Every model forbids unknown keys, so a typo fails the build with the key's path. ``load.py``
turns a validated ``AppArgs`` into the frozen dataclasses the rest of the application reads;
every default here is read from those dataclasses, so each setting has exactly one.

Schema (``applications[].args`` of a Serve config file)::

    config_file: configs/local.yaml     # optional; named in error messages (see load.py)
    models:
    - name: tiny-llama                  # the served name (the OpenAI "model" field)
      path: ~/.cache/meshserve/checkpoints/tiny-llama
      max_model_len: 512                # optional; else the pools' engine_args, else config.json
      enable_auto_tool_choice: true     # vLLM's tool / reasoning parsers (optional, vLLM spellings)
      tool_call_parser: hermes
      reasoning_parser: qwen3
      tool_strict_level: auto           # auto | function | parameter
      lora_modules: [name=path, {name: a, path: ..., base_model_name: ...}]  # vLLM's --lora-modules
    pools:
    - name: tt                          # unique; also the x-meshserve-pool routing header value
      engine: tt | vllm
      accelerator: tt | tpu | cuda | cpu
      model: tiny-llama
      role: both | prefill | decode
      replicas: 2                       # or autoscaling: {min_replicas, max_replicas, ...}
      max_ongoing_requests: 64          # per replica, Serve's own bound
      max_queued_requests: 256          # per handle, past it Serve rejects (-> 503 / 429); -1 = unbounded
      engine_args: {...}                # vLLM-spelled; validated by the engine's from_engine_args
      resources: {num_cpus: 0.5, memory: ..., resources: {...}}
      tt: {mesh_device: T3K}            # tt pools on accelerator tt
      tpu: {type: v6e, topology: 4x4}   # tpu pools
      tpu_backend: tpu-inference        # tpu pools: tpu-inference (default) | torchtpu
      tpu_kv_offload: false             # tpu pools: host-DRAM KV tier (the backend's offload connector)
      stream_interval_ms: 15            # under load, one message per stream per 15 ms (0 = per delta;
                                        # the default: 15 for placement own, 0 for placement ingress)
      placement: own | ingress          # ingress: one engine inside each ingress replica (the model's
                                        # only pool, role both, replicas = ingress.replicas)
    router: {policy: prefix+session+load, index_mode: precise, weights: {w_prefill: 1, ...},
             session_ttl_s: 600, max_in_flight_per_session: 2, session_active_s: 30, stats_max_age_s: 5,
             replicas: 1, placement: own, stats_period_s: 0.5, decision_timeout_s: 0.2, kv_event_log_size: 8192,
             speculative_ttl_s: 2}
    pd: {threshold_tokens: 512, busy_decode_threshold_tokens: 1}   # null: threshold_tokens alone
    ingress: {replicas: 1, max_concurrent_requests: 256, retry_after_s: 1, num_cpus: 0, access_log: true,
              api_keys: [...], max_request_bytes: 8388608, max_prompt_chars: null, max_tokens_cap: null,
              max_n: 128, trust_request_chat_template: false, max_failovers: 1,
              handle_transport: grpc}     # grpc (Serve's by-value handle path) | actor (object refs)
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from accel.vllm.tpu.backends import TpuBackendName
from deployments.config.app import AutoscalingConfig, Placement, PoolConfig
from deployments.config.ingress import MAX_N, HandleTransport, IngressConfig
from deployments.config.parsing import OutputParsing, ToolStrictLevel
from deployments.config.pd import PDConfig
from deployments.config.router import (
    CostWeights,
    IndexMode,
    LoadConfig,
    PolicyName,
    RouterConfig,
    RouterPlacement,
    SessionConfig,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelArgs(_Strict):
    name: str = Field(min_length=1)
    path: str = Field(min_length=1)
    max_model_len: int | None = Field(default=None, ge=1)
    # vLLM's tool-call / reasoning parsers for this model (deployments.config.parsing).
    enable_auto_tool_choice: bool = OutputParsing.enable_auto_tool_choice
    tool_call_parser: str | None = Field(default=OutputParsing.tool_call_parser, min_length=1)
    reasoning_parser: str | None = Field(default=OutputParsing.reasoning_parser, min_length=1)
    tool_strict_level: ToolStrictLevel = OutputParsing.tool_strict_level
    # vLLM's --lora-modules: "name=path" or the JSON form (a string or a mapping); deployments.config.lora.
    lora_modules: list[str | dict[str, Any]] = Field(default_factory=list)


class AutoscalingArgs(_Strict):
    min_replicas: int = Field(default=AutoscalingConfig.min_replicas, ge=0)
    max_replicas: int = Field(default=AutoscalingConfig.max_replicas, ge=1)
    initial_replicas: int | None = Field(default=AutoscalingConfig.initial_replicas, ge=0)
    target_ongoing_requests: float = Field(default=AutoscalingConfig.target_ongoing_requests, gt=0)
    upscale_delay_s: float = Field(default=AutoscalingConfig.upscale_delay_s, ge=0)
    downscale_delay_s: float = Field(default=AutoscalingConfig.downscale_delay_s, ge=0)


class ResourceArgs(_Strict):
    """Ray actor resources of one replica (on top of what the accelerator implies)."""

    num_cpus: float = Field(default=PoolConfig.num_cpus, ge=0)
    memory: int | None = Field(default=PoolConfig.memory_bytes, ge=0)
    resources: dict[str, float] = Field(default_factory=dict)


class TTArgs(_Strict):
    # tt-metal's MESH_DEVICE: N150, N300, T3K, TG, P150, P150x4, P150x8 or a literal "(r,c)".
    mesh_device: str = "N150"


class TPUArgs(_Strict):
    type: Literal["v5e", "v5p", "v6e", "v7x"]
    topology: str


class PoolArgs(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_-]+$")
    engine: Literal["tt", "vllm"]
    accelerator: Literal["tt", "tpu", "cuda", "cpu"]
    model: str
    role: Literal["both", "prefill", "decode"] = PoolConfig.role
    replicas: int | None = Field(default=None, ge=0)  # exactly one of replicas and autoscaling
    autoscaling: AutoscalingArgs | None = None
    max_ongoing_requests: int = Field(default=PoolConfig.max_ongoing_requests, ge=1)
    max_queued_requests: int = Field(default=PoolConfig.max_queued_requests, ge=-1)
    engine_args: dict[str, Any] = Field(default_factory=dict)
    resources: ResourceArgs = Field(default_factory=ResourceArgs)
    tt: TTArgs | None = None
    tpu: TPUArgs | None = None
    # tpu pools: the vLLM TPU backend (default tpu-inference) and the host-DRAM KV offload tier
    # (the backend's own offload connector; accel.vllm.tpu.backends).
    tpu_backend: TpuBackendName | None = None
    tpu_kv_offload: bool = False
    graceful_shutdown_timeout_s: float = Field(default=PoolConfig.graceful_shutdown_timeout_s, ge=0)
    step_timeout_s: float = Field(default=PoolConfig.step_timeout_s, gt=0)
    # PoolConfig.stream_interval_s, in milliseconds; None: the placement's default
    # (deployments.config.app.STREAM_INTERVAL_S).
    stream_interval_ms: float | None = Field(default=None, ge=0, le=1000)
    placement: Placement = PoolConfig.placement


class RouterWeightsArgs(_Strict):
    """``deployments.config.router.CostWeights``."""

    w_prefill: float = Field(default=CostWeights.w_prefill, ge=0)
    w_load_blocks: float = Field(default=CostWeights.w_load_blocks, ge=0)
    w_queue: float = Field(default=CostWeights.w_queue, ge=0)
    w_kv_usage: float = Field(default=CostWeights.w_kv_usage, ge=0)
    window_abs: float = Field(default=CostWeights.window_abs, ge=0)
    window_rel: float = Field(default=CostWeights.window_rel, ge=0)
    w_session: float = Field(default=CostWeights.w_session, ge=0)
    session_max_kv_usage: float = Field(default=CostWeights.session_max_kv_usage, ge=0)
    w_queued_prefill: float = Field(default=CostWeights.w_queued_prefill, ge=0)
    host_tier_credit: float = Field(default=CostWeights.host_tier_credit, ge=0, le=1)
    storage_tier_credit: float = Field(default=CostWeights.storage_tier_credit, ge=0, le=1)


class RouterArgs(_Strict):
    """``deployments.config.router.RouterConfig`` (the meaning of each setting is documented there)."""

    policy: PolicyName = RouterConfig.policy
    index_mode: IndexMode = RouterConfig.index_mode
    weights: RouterWeightsArgs = Field(default_factory=RouterWeightsArgs)
    session_ttl_s: float = Field(default=SessionConfig.ttl_s, gt=0)
    max_in_flight_per_session: int = Field(default=SessionConfig.max_in_flight_per_session, ge=1)
    session_active_s: float = Field(default=SessionConfig.active_s, ge=0)
    stats_max_age_s: float = Field(default=LoadConfig.stats_max_age_s, gt=0)
    replicas: int = Field(default=RouterConfig.replicas, ge=1)
    num_cpus: float = Field(default=RouterConfig.num_cpus, ge=0)
    placement: RouterPlacement = RouterConfig.placement
    stats_period_s: float = Field(default=RouterConfig.stats_period_s, gt=0)
    decision_timeout_s: float = Field(default=RouterConfig.decision_timeout_s, gt=0)
    kv_event_log_size: int = Field(default=RouterConfig.kv_event_log_size, ge=1)
    speculative_ttl_s: float = Field(default=RouterConfig.speculative_ttl_s, ge=0)


class PDArgs(_Strict):
    threshold_tokens: int = Field(default=PDConfig.threshold_tokens, ge=1)
    busy_decode_threshold_tokens: int | None = Field(default=PDConfig.busy_decode_threshold_tokens, ge=1)


class IngressArgs(_Strict):
    replicas: int = Field(default=IngressConfig.replicas, ge=1)
    num_cpus: float = Field(default=IngressConfig.num_cpus, ge=0)
    max_concurrent_requests: int = Field(default=IngressConfig.max_concurrent_requests, ge=1)
    retry_after_s: int = Field(default=IngressConfig.retry_after_s, ge=0)
    access_log: bool = IngressConfig.access_log
    api_keys: list[str] = Field(default_factory=list)  # else MESHSERVE_API_KEY; empty = no auth
    max_request_bytes: int = Field(default=IngressConfig.max_request_bytes, ge=1)
    max_prompt_chars: int | None = Field(default=IngressConfig.max_prompt_chars, ge=1)
    max_tokens_cap: int | None = Field(default=IngressConfig.max_tokens_cap, ge=1)
    max_n: int = Field(default=IngressConfig.max_n, ge=1, le=MAX_N)
    trust_request_chat_template: bool = IngressConfig.trust_request_chat_template
    max_failovers: int = Field(default=IngressConfig.max_failovers, ge=0)
    handle_transport: HandleTransport = IngressConfig.handle_transport


class AppArgs(_Strict):
    config_file: str | None = None
    models: list[ModelArgs] = Field(min_length=1)
    pools: list[PoolArgs] = Field(min_length=1)
    router: RouterArgs = Field(default_factory=RouterArgs)
    pd: PDArgs = Field(default_factory=PDArgs)
    ingress: IngressArgs = Field(default_factory=IngressArgs)
