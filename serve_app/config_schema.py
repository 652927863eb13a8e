"""The YAML ``args`` schema of the application, as pydantic models (the edge only).

Every model forbids unknown keys, so a typo fails the build with the key's path. ``config.py``
turns a validated ``AppArgs`` into the frozen dataclasses the rest of the application reads.

Schema (``applications[].args`` of a Serve config file)::

    config_file: configs/local.yaml     # optional; named in error messages (see config.py)
    models:
    - name: tiny-llama                  # the served name (the OpenAI "model" field)
      path: ~/.cache/meshserve/checkpoints/tiny-llama
      max_model_len: 512                # optional; else the pools' engine_args, else config.json
    pools:
    - name: tt                          # unique; also the x-meshserve-pool routing header value
      engine: tt | vllm
      accelerator: tt | tpu | cuda | cpu
      model: tiny-llama
      role: both | prefill | decode
      replicas: 2                       # or autoscaling: {min_replicas, max_replicas, ...}
      max_ongoing_requests: 64          # per replica, Serve's own bound
      max_queued_requests: 64           # per handle, past it Serve rejects (-> 503 / 429)
      engine_args: {...}                # vLLM-spelled; validated by the engine's from_engine_args
      resources: {num_cpus: 0.5, memory: ..., resources: {...}}
      tt: {mesh_device: T3K}            # tt pools on accelerator tt
      tpu: {type: v6e, topology: 4x4}   # tpu pools
      stream_interval_ms: 15            # under load, one message per stream per 15 ms (0 = per delta)
    router: {policy: prefix+session+load, index_mode: precise, weights: {w_prefill: 1, ...},
             session_ttl_s: 600, max_in_flight_per_session: 2, stats_max_age_s: 5,
             replicas: 1, stats_period_s: 0.5, decision_timeout_s: 0.2, kv_event_log_size: 8192}
    pd: {threshold_tokens: 512}
    ingress: {replicas: 1, max_concurrent_requests: 256, retry_after_s: 1, num_cpus: 0, access_log: true}
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelArgs(_Strict):
    name: str = Field(min_length=1)
    path: str = Field(min_length=1)
    max_model_len: int | None = Field(default=None, ge=1)


class AutoscalingArgs(_Strict):
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=1, ge=1)
    initial_replicas: int | None = Field(default=None, ge=0)
    target_ongoing_requests: float = Field(default=8.0, gt=0)
    upscale_delay_s: float = Field(default=30.0, ge=0)
    downscale_delay_s: float = Field(default=600.0, ge=0)


class ResourceArgs(_Strict):
    """Ray actor resources of one replica (on top of what the accelerator implies)."""

    num_cpus: float = Field(default=1.0, ge=0)
    memory: int | None = Field(default=None, ge=0)
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
    role: Literal["both", "prefill", "decode"] = "both"
    replicas: int | None = Field(default=None, ge=0)
    autoscaling: AutoscalingArgs | None = None
    max_ongoing_requests: int = Field(default=64, ge=1)
    max_queued_requests: int = Field(default=-1, ge=-1)
    engine_args: dict[str, Any] = Field(default_factory=dict)
    resources: ResourceArgs = Field(default_factory=ResourceArgs)
    tt: TTArgs | None = None
    tpu: TPUArgs | None = None
    # Seconds Serve waits for in-flight requests on scale-down/shutdown before killing the replica.
    graceful_shutdown_timeout_s: float = Field(default=20.0, ge=0)
    # While a replica streams several requests, each stream sends at most one message per this
    # many ms (deltas in between merged); the first token and the finish are never held, and a
    # lone stream gets every token at once. 0 = one message per engine delta.
    stream_interval_ms: float = Field(default=15.0, ge=0, le=1000)


class RouterWeightsArgs(_Strict):
    """``deployments.router.core.policy.CostWeights`` (defaults chosen on bench/router_sim.py)."""

    w_prefill: float = Field(default=1.0, ge=0)
    w_load_blocks: float = Field(default=4.0, ge=0)
    w_queue: float = Field(default=1.0, ge=0)
    w_kv_usage: float = Field(default=4.0, ge=0)
    window_abs: float = Field(default=8.0, ge=0)
    window_rel: float = Field(default=0.25, ge=0)


class RouterArgs(_Strict):
    policy: Literal["prefix+session+load", "round_robin", "least_loaded", "prefix", "session"] = "prefix+session+load"
    # precise: engines that publish KV events (TT) drive the prefix index; others are learned
    # from routing. approximate: every replica is learned from routing.
    index_mode: Literal["precise", "approximate"] = "precise"
    weights: RouterWeightsArgs = Field(default_factory=RouterWeightsArgs)
    session_ttl_s: float = Field(default=600.0, gt=0)
    # Concurrent requests of one session on its replica; more spill elsewhere (binding kept).
    max_in_flight_per_session: int = Field(default=2, ge=1)
    # Engine stats older than this are ignored (load falls back to the router's in-flight counts).
    stats_max_age_s: float = Field(default=5.0, gt=0)
    # Router replicas. Several agree: each follows every engine's KV event log (identical precise
    # indexes); a session's requests go to one of them by rendezvous hashing (its binding and
    # in-flight cap live there); each broadcasts its in-flight counts to the others every 0.1 s.
    replicas: int = Field(default=1, ge=1)
    num_cpus: float = Field(default=0.0, ge=0)
    # How often the router polls every engine replica's stats (membership + load).
    stats_period_s: float = Field(default=0.5, gt=0)
    # The ingress waits this long for a decision before choosing locally (counted as a fallback).
    decision_timeout_s: float = Field(default=0.2, gt=0)
    # KV events each engine replica keeps for router polls; a router further behind resyncs from
    # the replica's full block snapshot.
    kv_event_log_size: int = Field(default=8192, ge=1)


class PDArgs(_Strict):
    # Prompts whose uncached part (on the chosen decode replica) is at least this long are planned
    # as prefill-on-one-pool, decode-on-another; a mostly cached prompt prefills where it decodes.
    threshold_tokens: int = Field(default=512, ge=1)


class IngressArgs(_Strict):
    replicas: int = Field(default=1, ge=1)
    num_cpus: float = Field(default=0.0, ge=0)
    # Requests one ingress replica holds at once; past it new ones get 429 + Retry-After.
    max_concurrent_requests: int = Field(default=256, ge=1)
    retry_after_s: int = Field(default=1, ge=0)
    # Serve's per-request access log line of the ingress (the engines and router never log one).
    access_log: bool = True


class AppArgs(_Strict):
    config_file: str | None = None
    models: list[ModelArgs] = Field(min_length=1)
    pools: list[PoolArgs] = Field(min_length=1)
    router: RouterArgs = Field(default_factory=RouterArgs)
    pd: PDArgs = Field(default_factory=PDArgs)
    ingress: IngressArgs = Field(default_factory=IngressArgs)
