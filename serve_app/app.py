"""The builder ``serve run configs/<name>.yaml`` calls: ``import_path: serve_app.app:build_app``.

Graph: ``OpenAIIngress`` (HTTP) -> ``Router`` (decisions; ``router.replicas`` of them, with
``RendezvousRequestRouter`` on their handles so a session's requests reach the same router replica) and
-> one engine deployment per pool (``TTMeshReplica-<pool>`` / ``VllmReplica-<pool>``), each engine
deployment with ``PinnedReplicaRequestRouter`` on its handles so the ingress reaches the replica the
router chose. The router also holds the pool handles (to poll replica stats and KV events).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.deployment import Application

from accel.contract import ConfigError
from deployments.config.app import AppConfig, PoolConfig
from deployments.config.load import load_app_config
from deployments.replicas import tt_replica, vllm_replica
from deployments.replicas.tt_replica import TTMeshReplica
from deployments.replicas.vllm_replica import VllmReplica
from deployments.router.deployment import RouterDeployment
from serve_app.http.openai_ingress import make_ingress_class

logger = logging.getLogger(__name__)

PINNED_REQUEST_ROUTER = "deployments.handle_routing.pinned:PinnedReplicaRequestRouter"
RENDEZVOUS_REQUEST_ROUTER = "deployments.handle_routing.rendezvous:RendezvousRequestRouter"
ROUTER_NAME = "Router"
INGRESS_NAME = "OpenAIIngress"


def _request_router(path: str, stats_period_s: float) -> RequestRouterConfig:
    return RequestRouterConfig.model_validate(
        {"request_router_class": path, "request_routing_stats_period_s": stats_period_s}
    )


def engine_deployment_options(pool: PoolConfig) -> dict[str, Any]:
    """Serve deployment options of a pool's engine deployment (resources and placement from the
    engine's replica module)."""
    if pool.engine == "tt":
        opts = tt_replica.deployment_options(pool)
    else:
        opts = vllm_replica.deployment_options(pool)
    opts.update(
        name=pool.deployment_name,
        max_ongoing_requests=pool.max_ongoing_requests,
        max_queued_requests=pool.max_queued_requests,
        graceful_shutdown_timeout_s=pool.graceful_shutdown_timeout_s,
        health_check_period_s=10,
        # Per-call access logs on the token path (and the router's stats polls) cost CPU per
        # request; the ingress keeps its HTTP access log.
        logging_config={"enable_access_log": False},
        request_router_config=_request_router(PINNED_REQUEST_ROUTER, stats_period_s=2),
    )
    if pool.autoscaling is not None:
        a = pool.autoscaling
        opts["autoscaling_config"] = {
            "min_replicas": a.min_replicas,
            "max_replicas": a.max_replicas,
            "initial_replicas": a.initial_replicas,
            "target_ongoing_requests": a.target_ongoing_requests,
            "upscale_delay_s": a.upscale_delay_s,
            "downscale_delay_s": a.downscale_delay_s,
        }
    else:
        opts["num_replicas"] = pool.replicas
    return opts


def build_from_config(
    config: AppConfig,
    engine_factories: Mapping[str, Any] | None = None,
    app_runtime_env: Mapping[str, Any] | None = None,
) -> Application:
    """The application graph of a validated config. ``engine_factories`` (engine kind ->
    ``callable(PoolConfig) -> Engine``) replaces the real engines, for tests.
    ``app_runtime_env``: the application's ``runtime_env`` (default: the one this build runs
    under, ``current_app_runtime_env()``), which every deployment setting its own inherits."""
    factories = dict(engine_factories or {})
    app_env = app_runtime_env if app_runtime_env is not None else current_app_runtime_env()
    pool_apps: dict[str, Application] = {}
    for i, pool in enumerate(config.pools):
        if pool.placement == "ingress":
            continue  # built inside each ingress replica (ingress_deployment_options)
        cls = TTMeshReplica if pool.engine == "tt" else VllmReplica
        options = _pool_options(config, i, pool)
        inherit_runtime_env(options["ray_actor_options"], app_env)
        pool_apps[pool.name] = serve.deployment(**options)(cls).bind(
            pool, factories.get(pool.engine), kv_event_log_size=config.router.kv_event_log_size
        )
    router = None  # router.placement ingress: the ingress builds its router in-process
    if config.router.placement == "own":
        router = serve.deployment(
            name=ROUTER_NAME,
            num_replicas=config.router.replicas,
            ray_actor_options={"num_cpus": config.router.num_cpus},
            max_ongoing_requests=100_000,
            logging_config={"enable_access_log": False},
            request_router_config=_request_router(RENDEZVOUS_REQUEST_ROUTER, stats_period_s=10),
        )(RouterDeployment).bind(config, pool_apps)
    ingress_options = ingress_deployment_options(config)
    inherit_runtime_env(ingress_options["ray_actor_options"], app_env)
    ingress = serve.deployment(**ingress_options)(make_ingress_class()).bind(config, router, pool_apps, factories)
    return ingress


def current_app_runtime_env() -> dict[str, Any]:
    """The ``runtime_env`` this build runs under: Serve runs an application's build task in the
    application's ``runtime_env`` (its Serve config entry); empty outside Ray."""
    if not ray.is_initialized():
        return {}
    return dict(ray.get_runtime_context().runtime_env)


def inherit_runtime_env(actor_options: dict[str, Any], app_env: Mapping[str, Any]) -> None:
    """A deployment that sets its own ``runtime_env`` (a TT pool's ``MESH_DEVICE``, an ingress
    holding one) gets the application's under it: its own fields win, ``env_vars`` merge per key.
    Serve 2.60 hands the application's ``runtime_env`` only to deployments that set none
    (``ray/serve/_private/build_app.py``, ``_set_default_runtime_env``): without this the
    application's ``EXTRA_MODELS_DIR`` or tt-metal ``PYTHONPATH`` never reached a TT replica."""
    own = actor_options.get("runtime_env")
    if own is None or not app_env:
        return
    merged = {**app_env, **own}
    env_vars = {**app_env.get("env_vars", {}), **own.get("env_vars", {})}
    if env_vars:
        merged["env_vars"] = env_vars
    actor_options["runtime_env"] = merged


def ingress_deployment_options(config: AppConfig) -> dict[str, Any]:
    """The ingress deployment's options; with pools placed in the ingress (``placement:
    ingress``) each replica also reserves what one engine replica of each of them needs
    (resources, memory, the TT mesh's environment) and gets their shutdown and health timing."""
    actor: dict[str, Any] = {"num_cpus": config.ingress.num_cpus}
    options: dict[str, Any] = dict(
        name=INGRESS_NAME,
        num_replicas=config.ingress.replicas,
        # Our own bound (max_concurrent_requests -> 429) decides; Serve's must not be lower.
        max_ongoing_requests=config.ingress.max_concurrent_requests + 16,
        logging_config={"enable_access_log": config.ingress.access_log},
    )
    resources: dict[str, float] = {}
    for i, pool in enumerate(config.pools):
        if pool.placement != "ingress":
            continue
        engine = _pool_options(config, i, pool)["ray_actor_options"]
        for key in ("num_cpus", "num_gpus", "memory"):
            if key in engine:
                actor[key] = actor.get(key, 0) + engine[key]
        for name, amount in engine.get("resources", {}).items():
            resources[name] = resources.get(name, 0) + amount
        env = engine.get("runtime_env", {}).get("env_vars", {})
        if env:
            actor.setdefault("runtime_env", {}).setdefault("env_vars", {}).update(env)
        options["graceful_shutdown_timeout_s"] = max(
            options.get("graceful_shutdown_timeout_s", 0), pool.graceful_shutdown_timeout_s
        )
        options["health_check_period_s"] = 10
    if resources:
        actor["resources"] = resources
    options["ray_actor_options"] = actor
    return options


def _pool_options(config: AppConfig, i: int, pool: PoolConfig) -> dict[str, Any]:
    """``engine_deployment_options`` of ``config.pools[i]``; a placement error names its key."""
    try:
        return engine_deployment_options(pool)
    except ConfigError as exc:  # placement: TPU topology, MESH_DEVICE name
        section = "tpu" if pool.accelerator == "tpu" else "tt"
        raise ConfigError(f"{config.config_file}: pools[{i}].{section}: {exc}") from None


def build_app(args: dict[str, Any]) -> Application:
    """Serve builder: YAML ``args`` -> ``Application``. Raises ``ConfigError`` naming the file
    (``args.config_file``) and the key (``engine_args`` included: the loader parses them into each
    pool's engine config, which the pool's replicas are built from)."""
    return build_from_config(load_app_config(args))
