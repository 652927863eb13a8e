"""The application's typed config, built once: YAML ``args`` in, frozen dataclasses out.

``load_app_config(args)`` validates the raw mapping with the pydantic schema (``schema.py``,
unknown keys refused), checks cross references (pool -> model, unique names, replicas XOR
autoscaling, accelerator-specific sections), parses each pool's ``engine_args`` into its engine's
typed config (``accel.tt.config.TTEngineConfig`` / ``accel.vllm.config.VllmEngineConfig``, which
the replicas are built from as they are), checks which prefill and decode pools pair
(``pd.py``) and returns an ``AppConfig`` (``app.py``).

Naming the file in errors: a Serve builder receives only ``args`` (with ``serve run x.yaml`` it
runs inside a controller task, so ``sys.argv`` says nothing), therefore the file is passed in
the args themselves as ``config_file`` — every file in ``configs/`` sets it. Without it errors
name ``<serve args>``. Every error is a ``ConfigError`` whose message reads
``<file>: <key path>: <problem>``, e.g. ``configs/local.yaml: pools[1].engine_argz: unknown key``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from accel.checkpoint import max_position_embeddings
from accel.contract import ConfigError
from accel.envs import ENVS
from accel.tt.config import TTEngineConfig
from accel.vllm.config import VllmEngineConfig
from accel.vllm.tpu.backends import DEFAULT_BACKEND, check_kv_connector, get_backend
from deployments.config.app import (
    STREAM_INTERVAL_S,
    AppConfig,
    AutoscalingConfig,
    EngineConfig,
    ModelConfig,
    PoolConfig,
)
from deployments.config.ingress import IngressConfig
from deployments.config.lora import VLLM_DEFAULT_MAX_LORA_RANK, resolve_lora_modules
from deployments.config.parsing import OutputParsing
from deployments.config.pd import KV_ROLES, PD_ROLES, TPU_CONNECTORS, PDConfig, pairing_problem
from deployments.config.router import CostWeights, LoadConfig, RouterConfig, SessionConfig
from deployments.config.schema import AppArgs, IngressArgs, ModelArgs, PoolArgs, RouterArgs

UNKNOWN_FILE = "<serve args>"


def load_app_config(args: Mapping[str, Any] | AppArgs, config_file: str | None = None) -> AppConfig:
    """Validate builder ``args`` into an ``AppConfig``; every problem is a ``ConfigError``
    naming the file and the key."""
    raw = args.model_dump() if isinstance(args, AppArgs) else dict(args)
    file = config_file or raw.get("config_file") or UNKNOWN_FILE
    try:
        parsed = AppArgs.model_validate(raw)
    except ValidationError as err:
        raise _format_validation(file, err) from None

    _check_names(file, parsed)
    pd = PDConfig(parsed.pd.threshold_tokens, parsed.pd.busy_decode_threshold_tokens)
    pool_by_index: dict[int, PoolConfig] = {}
    models = []
    for i, m in enumerate(parsed.models):
        path = Path(m.path).expanduser()
        served = [(j, p) for j, p in enumerate(parsed.pools) if p.model == m.name]
        if not served:
            raise _fail(file, f"models[{i}]", f"model {m.name!r} is served by no pool")
        max_model_len = _resolve_max_model_len(file, i, m, path, served)
        parsing = _parsing(file, i, m)
        for j, p in served:
            pool_by_index[j] = _to_pool(file, j, p, path, max_model_len, parsing)
        pools = tuple(pool_by_index[j] for j, _ in served)
        try:
            lora = resolve_lora_modules(m.lora_modules, m.name, [p.max_loras for p in pools], _max_lora_rank(pools))
        except ConfigError as exc:
            raise _fail(file, f"models[{i}].lora_modules", str(exc)) from None
        models.append(ModelConfig(m.name, path, max_model_len, pools, pd, parsing, lora))
    _check_served_names(file, models)
    all_pools = tuple(pool_by_index[j] for j in range(len(parsed.pools)))
    _check_pd_pools(file, all_pools)
    ing = parsed.ingress
    _check_placements(file, parsed.pools, ing.replicas)
    if parsed.router.placement == "ingress" and (ing.replicas, parsed.router.replicas) != (1, 1):
        raise _fail(file, "router.placement", "inside the ingress: ingress.replicas and router.replicas must be 1")
    return AppConfig(
        config_file=file,
        models=tuple(models),
        pools=all_pools,
        router=_to_router(parsed.router),
        pd=pd,
        ingress=_to_ingress(ing),
    )


def _check_names(file: str, parsed: AppArgs) -> None:
    """Model and pool names unique, every pool of a known model, each pool's own checks."""
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


def _max_lora_rank(pools: Sequence[PoolConfig]) -> int:
    """The largest adapter rank every LoRA pool of a model takes."""
    return min((p.max_lora_rank for p in pools if p.max_loras), default=VLLM_DEFAULT_MAX_LORA_RANK)


def _check_served_names(file: str, models: Sequence[ModelConfig]) -> None:
    """Every served name (models and their adapters) names one thing."""
    seen = {m.name for m in models}
    for i, model in enumerate(models):
        for adapter in model.lora_modules:
            if adapter.name in seen:
                raise _fail(file, f"models[{i}].lora_modules", f"{adapter.name!r} is already a served name")
            seen.add(adapter.name)


def _to_ingress(ing: IngressArgs) -> IngressConfig:
    fields = ing.model_dump()  # IngressArgs mirrors IngressConfig field for field
    # As vLLM: the configured keys take precedence over the environment variable.
    fields["api_keys"] = tuple(ing.api_keys) or ((ENVS.api_key,) if ENVS.api_key else ())
    return IngressConfig(**fields)


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


def _resolve_max_model_len(
    file: str, index: int, model: ModelArgs, path: Path, pools: list[tuple[int, PoolArgs]]
) -> int:
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
    if pool.accelerator != "tpu" and pool.tpu_backend is not None:
        raise _fail(file, f"{key}.tpu_backend", "only pools on accelerator tpu choose a TPU backend")
    if pool.accelerator != "tpu" and pool.tpu_kv_offload:
        raise _fail(file, f"{key}.tpu_kv_offload", "only pools on accelerator tpu have the TPU host-DRAM KV tier")


def _check_placements(file: str, pools: Sequence[PoolArgs], ingress_replicas: int) -> None:
    """A pool whose engines run inside the ingress replicas (``placement: ingress``) has one engine
    per ingress replica and nothing to route between: it must be its model's only pool (so role
    both: the PD pairing rules refuse a lone prefill or decode pool) and have exactly
    ``ingress.replicas`` replicas (no autoscaling, no TPU slice group)."""
    for i, pool in enumerate(pools):
        if pool.placement != "ingress":
            continue
        key = f"pools[{i}]"
        others = [p.name for p in pools if p.model == pool.model and p is not pool]
        if others:
            raise _fail(
                file, f"{key}.placement", f"an engine inside the ingress must be its model's only pool (also: {others})"
            )
        if pool.accelerator == "tpu":
            raise _fail(
                file, f"{key}.placement", "a TPU slice replica needs its own placement group: use placement own"
            )
        if pool.replicas != ingress_replicas:
            raise _fail(
                file,
                f"{key}.replicas",
                f"placement ingress runs one engine per ingress replica: set replicas to ingress.replicas "
                f"({ingress_replicas}), not {pool.replicas if pool.autoscaling is None else 'autoscaling'}",
            )


def _parsing(file: str, i: int, m: ModelArgs) -> OutputParsing:
    try:
        return OutputParsing(m.enable_auto_tool_choice, m.tool_call_parser, m.reasoning_parser, m.tool_strict_level)
    except ConfigError as exc:
        raise _fail(file, f"models[{i}].enable_auto_tool_choice", str(exc)) from None


def _engine_config(
    file: str, i: int, pool: PoolArgs, path: Path, max_model_len: int, parsing: OutputParsing
) -> EngineConfig:
    """The pool's engine_args (vLLM spellings) as its engine's typed config, with the model's
    checkpoint folder and context length filled in; a vLLM engine also gets the model's
    ``reasoning_parser`` (what ``vllm serve --reasoning-parser`` hands its engine: structured
    outputs then start after the reasoning ends)."""
    args = copy.deepcopy(dict(pool.engine_args))
    args["model"] = str(path)
    args.setdefault("max_model_len", max_model_len)
    if pool.accelerator == "tpu":
        backend = get_backend(pool.tpu_backend or DEFAULT_BACKEND)
        key = f"pools[{i}].engine_args.kv_transfer_config"
        try:
            check_kv_connector(backend, args.get("kv_transfer_config"), key)
        except ConfigError as exc:
            raise ConfigError(f"{file}: {exc}") from None
        if pool.tpu_kv_offload:
            if args.get("kv_transfer_config") is not None:
                raise _fail(
                    file,
                    f"pools[{i}].tpu_kv_offload",
                    f"the engine already loads {args['kv_transfer_config'].get('kv_connector')} "
                    f"(engine_args.kv_transfer_config) and a {backend.name} engine loads one connector here; "
                    "drop one of them",
                )
            spec = backend.default_offload_connector
            args["kv_transfer_config"] = {
                "kv_connector": spec.name,
                "kv_connector_module_path": spec.module_path,
                "kv_role": "kv_both",
            }
    if pool.engine == "vllm":
        # vLLM labels its metrics (model_name) with the served name, as `vllm serve
        # --served-model-name` does; without it, the checkpoint path.
        args.setdefault("served_model_name", pool.model)
        if parsing.reasoning_parser:
            args.setdefault("reasoning_parser", parsing.reasoning_parser)
    try:
        if pool.engine == "tt":
            return TTEngineConfig.from_engine_args(args)
        return VllmEngineConfig.from_engine_args(args)
    except (ConfigError, ValueError, TypeError) as exc:
        raise _fail(file, f"pools[{i}].engine_args", str(exc)) from None


def _to_pool(file: str, i: int, pool: PoolArgs, path: Path, max_model_len: int, parsing: OutputParsing) -> PoolConfig:
    engine_config = _engine_config(file, i, pool, path, max_model_len, parsing)
    if isinstance(engine_config, TTEngineConfig) and engine_config.tt.engine_core_process and pool.role in PD_ROLES:
        raise _fail(
            file,
            f"pools[{i}].engine_args.additional_config.tt.engine_core_process",
            "a prefill/decode pool's KV transfer runs in the step loop, in the replica's process: leave it off",
        )
    auto = pool.autoscaling
    return PoolConfig(
        name=pool.name,
        accelerator=pool.accelerator,
        model=pool.model,
        model_path=path,
        max_model_len=max_model_len,
        engine_config=engine_config,
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
        num_cpus=pool.resources.num_cpus,
        memory_bytes=pool.resources.memory,
        extra_resources=dict(pool.resources.resources),
        tt_mesh_device=pool.tt.mesh_device if pool.tt else None,
        tpu_type=pool.tpu.type if pool.tpu else None,
        tpu_topology=pool.tpu.topology if pool.tpu else None,
        tpu_backend=pool.tpu_backend or DEFAULT_BACKEND,
        graceful_shutdown_timeout_s=pool.graceful_shutdown_timeout_s,
        step_timeout_s=pool.step_timeout_s,
        stream_interval_s=(
            STREAM_INTERVAL_S[pool.placement] if pool.stream_interval_ms is None else pool.stream_interval_ms / 1000
        ),
        placement=pool.placement,
    )


def _to_router(r: RouterArgs) -> RouterConfig:
    return RouterConfig(
        policy=r.policy,
        index_mode=r.index_mode,
        weights=CostWeights(**r.weights.model_dump()),
        sessions=SessionConfig(r.session_ttl_s, r.max_in_flight_per_session, r.session_active_s),
        load=LoadConfig(stats_max_age_s=r.stats_max_age_s),
        replicas=r.replicas,
        num_cpus=r.num_cpus,
        placement=r.placement,
        stats_period_s=r.stats_period_s,
        decision_timeout_s=r.decision_timeout_s,
        kv_event_log_size=r.kv_event_log_size,
        speculative_ttl_s=r.speculative_ttl_s,
    )


def _tpu_pd_connector_problem(pool: PoolConfig) -> str | None:
    """Why a TPU prefill/decode pool's connector cannot hand KV over (None: it can)."""
    connector = pool.kv_connector
    pd_connectors = get_backend(pool.tpu_backend).connectors_for("pd")
    if connector in {c.name for c in pd_connectors}:
        return None
    first = pd_connectors[0]
    return (
        f"a TPU pool with role {pool.role} needs its backend's own prefill/decode connector "
        f"(TPU backends load no other, so meshserve's cannot be wired in): one of "
        f"{', '.join(c.name for c in pd_connectors)} for {pool.tpu_backend}, e.g. "
        f"{{kv_connector: {first.name}, kv_connector_module_path: {first.module_path}, "
        f"kv_role: {KV_ROLES[pool.role][0]}}}; got {connector or 'none'}"
    )


def _check_pd_pools(file: str, pools: tuple[PoolConfig, ...]) -> None:
    """Prefill/decode pools must be able to hand KV to each other (``pd.py``): a TPU pool needs
    its backend's own connector, a native connector the kv_role of its side, and a prefill pool a
    decode pool on its KV path (else it would never get a request)."""
    for i, pool in enumerate(pools):
        key = f"pools[{i}].engine_args.kv_transfer_config"
        config = pool.engine_config.kv_transfer_config if isinstance(pool.engine_config, VllmEngineConfig) else None
        connector = pool.kv_connector
        if connector in TPU_CONNECTORS and pool.accelerator != "tpu":
            raise _fail(file, f"{key}.kv_connector", f"{connector} loads only on TPU backends")
        if pool.role not in PD_ROLES:
            continue
        if pool.accelerator == "tt":
            # KV export/import (accel/tt/kv_hooks.py) reads and writes the cache as torch tensors;
            # a tt-metal class's cache is ttnn device tensors, which need ttnn's own host transfers.
            raise _fail(
                file,
                f"pools[{i}].role",
                f"prefill/decode disaggregation is not supported on a Tenstorrent mesh yet (KV export "
                f"and import index the cache with torch, not ttnn's host transfer calls); use role: "
                f"both for pool {pool.name!r} (or accelerator: cpu, the torch program)",
            )
        if pool.accelerator == "tpu":
            problem = _tpu_pd_connector_problem(pool)
            if problem is not None:
                raise _fail(file, key, problem)
        if connector is not None and config is not None and config.get("kv_role") not in KV_ROLES[pool.role]:
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
