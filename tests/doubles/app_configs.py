"""Hand-built app configs for tests of the router, the ingress and the pairing rules: real
``PoolConfig`` / ``ModelConfig`` / ``AppConfig`` objects (with real engine configs) for pools that
need no checkpoint, built without ``load_app_config`` so a test can also build the
combinations the loader refuses (e.g. a TPU prefill pool without its connector)."""

from __future__ import annotations

from pathlib import Path

from accel.tt.config import TTEngineConfig
from accel.vllm.config import VllmEngineConfig
from deployments.config.app import AppConfig, ModelConfig, PoolConfig
from deployments.config.ingress import IngressConfig
from deployments.config.pd import PDConfig
from deployments.config.router import RouterConfig

CHECKPOINT = Path("/nonexistent/checkpoint")
MAX_MODEL_LEN = 2048


def pool_config(
    name: str,
    model: str = "m",
    engine: str = "tt",
    accelerator: str = "cpu",
    role: str = "both",
    block_size: int = 16,
    kv_connector: str | None = None,
) -> PoolConfig:
    """A pool of ``engine`` whose engine KV blocks hold ``block_size`` tokens; ``kv_connector``:
    the vLLM connector its engine_args would configure (kv_role ``kv_both``)."""
    if engine == "tt":
        engine_config: TTEngineConfig | VllmEngineConfig = TTEngineConfig(
            model=str(CHECKPOINT), max_model_len=MAX_MODEL_LEN, block_size=block_size
        )
    else:
        transfer = {"kv_connector": kv_connector, "kv_role": "kv_both"} if kv_connector else None
        engine_config = VllmEngineConfig(
            model=str(CHECKPOINT), max_model_len=MAX_MODEL_LEN, block_size=block_size, kv_transfer_config=transfer
        )
    return PoolConfig(name, accelerator, model, CHECKPOINT, MAX_MODEL_LEN, engine_config, role=role)  # type: ignore[arg-type]


def app_config(
    pools: tuple[PoolConfig, ...] | list[PoolConfig],
    router: RouterConfig | None = None,
    pd: PDConfig | None = None,
    ingress: IngressConfig | None = None,
) -> AppConfig:
    """The app serving ``pools`` (one model per distinct ``pool.model``, in first-seen order)."""
    pd = pd or PDConfig()
    names = dict.fromkeys(p.model for p in pools)
    models = tuple(
        ModelConfig(name, CHECKPOINT, MAX_MODEL_LEN, tuple(p for p in pools if p.model == name), pd) for name in names
    )
    return AppConfig("<test>", models, tuple(pools), router or RouterConfig(), pd, ingress or IngressConfig())
