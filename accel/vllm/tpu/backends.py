"""The two TPU backends of vLLM a slice pool can run (``tpu_backend:``), and what is true of each.

Every name below was read in the backend's own code, and the contract checks
(``accel.vllm.tpu.contract``; ``tests/accel/vllm/tpu/test_backend_contract.py`` in CI, and the
replica's start-up check on a TPU host) hold them against the installed code:

- **tpu-inference** (``vllm-tpu`` = vLLM + ``tpu-inference``, JAX/libtpu), read in the
  ``tpu-inference==0.32.0`` wheel (pure Python, on PyPI). Selected by vLLM's *built-in* ``tpu``
  platform plugin when ``import libtpu`` works (it returns ``vllm.platforms.tpu.TpuPlatform``,
  which re-exports ``tpu_inference.platforms.TpuPlatform``). One JAX SPMD worker per TPU
  **host**: its Ray executors give each worker the TPU count of placement-group bundle 0, so
  the slice group has one bundle per host ``{"TPU": chips_per_host}``.
- **torchtpu** (``vllm-torchtpu`` on ``torch_tpu``, PyTorch-native), read in the upstream source
  at ``TORCHTPU_SOURCE`` (its ``-core`` package on PyPI is an empty placeholder, so CI cannot
  install it; the replica checks the names at start-up on a TPU host instead). An out-of-tree
  ``vllm.platform_plugins`` entry point that always activates. One worker process per **chip**:
  its Ray executors ask ``{"TPU": 1}`` per worker and pack ``world_size / len(bundles)``
  workers per TPU bundle, so per-chip bundles ``{"TPU": 1}`` (static placement) and Ray's
  per-host slice bundles (deferred placement) both work.

Both: single host without parallelism runs vLLM's ``"uni"`` executor; multi-host slices run the
backend's Ray executor when ``TPU_MULTIHOST_BACKEND=ray`` (V2 when vLLM's
``VLLM_USE_RAY_V2_EXECUTOR_BACKEND``, default on in vLLM 0.32), which **reuses
``parallel_config.placement_group`` when it is set** (our slice group) instead of making its own.
Each accepts only its own KV connectors (tpu-inference raises ``ValueError``, torchtpu asserts),
so a pool's ``kv_transfer_config`` is checked against ``accepted_connectors`` at config time.

Pure data, no imports of either backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from accel.contract import ConfigError

ConnectorRole = Literal["pd", "offload", "multi", "bench"]
WorkerPlacement = Literal["per_host", "per_chip"]

# Where the torchtpu names were read: the public mirror of vllm-torchtpu, file -> commit.
TORCHTPU_REPO = "kowalski-4831/vllm-torchtpu"
TORCHTPU_SOURCE: dict[str, str] = {
    "pyproject.toml": "017472ee5089af7809c6d8f5a504b725d023fa04",
    "src/vllm_torchtpu/platforms/__init__.py": "1b4d7d61b4d5797b3ba567ea79e33de2d7a005f9",
    "src/vllm_torchtpu/platforms/tpu_platform.py": "0095cdcbda2a44e2b3cd5975d2954765e2e95629",
    "src/vllm_torchtpu/executors/ray_distributed_executor.py": "012e4f24a331c37d53769068cff5fb36617cd3aa",
    "src/vllm_torchtpu/envs.py": "02df73bc6e2efe389c2c5344e5cd4ad22ee357d0",
    "src/vllm_torchtpu/distributed/kv_transfer/tpu_connector.py": "2e72d55642963ef04530b3400dbb55ebec2b8945",
}


@dataclass(frozen=True)
class KVConnectorSpec:
    """One vLLM KV connector a backend accepts: ``kv_connector`` / ``kv_connector_module_path``
    as a pool's ``kv_transfer_config`` spells them; ``role``: what it is for (``pd``: hands a
    prefill's KV to a decode engine; ``offload``: host-DRAM KV tier; ``multi``: combines
    others; ``bench``: the backend's benchmark stand-in, not for serving)."""

    name: str
    module_path: str
    role: ConnectorRole


@dataclass(frozen=True)
class TpuBackend:
    """What meshserve relies on of one TPU backend (module docstring). Dotted paths are
    ``module.Class``; ``env_vars``: the variables of the backend's own env module we set or
    document (each checked to exist there)."""

    name: str  # the pool's tpu_backend value
    source: str  # what the names were read in
    distribution: str  # what `pip install` names (for error messages)
    python_versions: tuple[str, ...]  # CPython versions its wheels exist for
    platform_cls: str
    platform_entry_point: str | None  # out-of-tree vllm.platform_plugins entry; None = vLLM built-in
    worker_cls: str
    ray_executor_cls: str
    ray_executor_v2_cls: str
    multiproc_executor_cls: str
    envs_module: str
    env_vars: tuple[str, ...]
    workers: WorkerPlacement
    connectors: tuple[KVConnectorSpec, ...]

    @property
    def accepted_connectors(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.connectors)

    def connectors_for(self, role: ConnectorRole) -> tuple[KVConnectorSpec, ...]:
        return tuple(c for c in self.connectors if c.role == role)

    def connector(self, name: str) -> KVConnectorSpec | None:
        return next((c for c in self.connectors if c.name == name), None)

    @property
    def default_offload_connector(self) -> KVConnectorSpec:
        return self.connectors_for("offload")[0]


TPU_INFERENCE = TpuBackend(
    name="tpu-inference",
    source="tpu-inference==0.32.0 (PyPI wheel)",
    distribution="vllm-tpu==0.32.0 (pulls tpu-inference==0.32.0, jax 0.11.2, libtpu 0.0.48)",
    python_versions=("3.12",),  # vllm-tpu's last wheels (<=0.21) are cp312; TPU VMs run 3.12
    platform_cls="tpu_inference.platforms.tpu_platform.TpuPlatform",
    platform_entry_point=None,
    worker_cls="tpu_inference.worker.tpu_worker.TPUWorker",
    ray_executor_cls="tpu_inference.executors.ray_distributed_executor.RayDistributedExecutor",
    ray_executor_v2_cls="tpu_inference.executors.ray_distributed_executor_v2.RayDistributedExecutorV2",
    multiproc_executor_cls="tpu_inference.executors.multiproc_executor.MultiprocExecutor",
    envs_module="tpu_inference.envs",
    env_vars=(
        "JAX_PLATFORMS",
        "TPU_MULTIHOST_BACKEND",
        "TPU_NAME",
        "TPU_WORKER_ID",
        "TPU_ACCELERATOR_TYPE",
        "MODEL_IMPL_TYPE",
        "SKIP_JAX_PRECOMPILE",
        "NEW_MODEL_DESIGN",
        "TPU_OFFLOAD_NUM_CPU_CHUNKS",
    ),
    workers="per_host",
    connectors=(
        KVConnectorSpec("TPUConnector", "tpu_inference.distributed.tpu_connector", "pd"),
        KVConnectorSpec("TPUConnectorHMA", "tpu_inference.distributed.tpu_connector_hma", "pd"),
        KVConnectorSpec("TPUOffloadConnector", "tpu_inference.offload.tpu_offload_connector", "offload"),
        KVConnectorSpec("RaidenOffloadConnector", "tpu_inference.offload.raiden_offload_connector", "offload"),
    ),
)

TORCHTPU = TpuBackend(
    name="torchtpu",
    source=f"{TORCHTPU_REPO} (commits per file: accel.vllm.tpu.backends.TORCHTPU_SOURCE)",
    distribution=(
        "vllm-torchtpu (Google's torch-tpu registry; pins vLLM 0.29.0, torch 2.13.0, torch-tpu, "
        "jax 0.10.2, libtpu 0.0.47) with torch-tpu from PyPI"
    ),
    python_versions=("3.12",),  # its pyproject: requires-python >=3.12,<3.13 (tpu-raiden-torch is cp312)
    platform_cls="vllm_torchtpu.platforms.tpu_platform.TpuPlatform",
    platform_entry_point="vllm_torchtpu.platforms:register_tpu_platform",
    worker_cls="vllm_torchtpu.worker.tpu_worker.TPUWorker",
    ray_executor_cls="vllm_torchtpu.executors.ray_distributed_executor.RayDistributedExecutor",
    ray_executor_v2_cls="vllm_torchtpu.executors.ray_distributed_executor_v2.RayDistributedExecutorV2",
    multiproc_executor_cls="vllm_torchtpu.executors.tpu_multiproc_executor.TpuMultiprocExecutor",
    envs_module="vllm_torchtpu.envs",
    env_vars=(
        "JAX_PLATFORMS",
        "TPU_MULTIHOST_BACKEND",
        "TPU_NAME",
        "TPU_WORKER_ID",
        "DP_SCHED_ENABLED",
        "TPU_VLLM_ENABLE_UNIFIED_BLOCK_POOL",
        "TPU_KV_RESHARD_TRANSPORT",
    ),
    workers="per_chip",
    connectors=(
        KVConnectorSpec("TPUConnector", "vllm_torchtpu.distributed.kv_transfer.tpu_connector", "pd"),
        KVConnectorSpec("TPURaidenConnector", "vllm_torchtpu.distributed.kv_transfer.tpu_connector", "pd"),
        KVConnectorSpec("TPUMultiConnector", "vllm_torchtpu.distributed.kv_transfer.tpu_multi_connector", "multi"),
        KVConnectorSpec("TPURaidenOffloadingConnector", "vllm_torchtpu.offload.raiden_connector", "offload"),
        # Accepted by its platform check, but a benchmark stand-in (synthetic KV), never served.
        KVConnectorSpec(
            "DecodeBenchConnector", "vllm.distributed.kv_transfer.kv_connector.v1.decode_bench_connector", "bench"
        ),
    ),
)

BACKENDS: dict[str, TpuBackend] = {b.name: b for b in (TPU_INFERENCE, TORCHTPU)}
TpuBackendName = Literal["tpu-inference", "torchtpu"]
DEFAULT_BACKEND: TpuBackendName = "tpu-inference"


def get_backend(name: str) -> TpuBackend:
    if name not in BACKENDS:
        raise ConfigError(f"tpu_backend: unknown backend {name!r}; expected one of {sorted(BACKENDS)}")
    return BACKENDS[name]


def all_tpu_connectors() -> frozenset[str]:
    """Every connector name some TPU backend accepts (none of them loads off TPU)."""
    return frozenset(c.name for b in BACKENDS.values() for c in b.connectors)


def check_kv_connector(backend: TpuBackend, kv_transfer_config: dict[str, object] | None, key: str) -> None:
    """Raise ``ConfigError`` naming ``key`` when the pool's connector is not one ``backend`` loads
    (the backend itself would refuse it when the engine starts, minutes into a TPU start-up), or
    when its module path is not where that backend defines it."""
    if kv_transfer_config is None:
        return
    name = kv_transfer_config.get("kv_connector")
    spec = backend.connector(name) if isinstance(name, str) else None
    served = [c.name for c in backend.connectors if c.role != "bench"]
    if spec is None or spec.role == "bench":
        raise ConfigError(
            f"{key}.kv_connector: {name!r} is not a KV connector the {backend.name} backend loads; "
            f"accepted: {', '.join(served)}"
        )
    module_path = kv_transfer_config.get("kv_connector_module_path")
    if module_path is not None and module_path != spec.module_path:
        raise ConfigError(
            f"{key}.kv_connector_module_path: the {backend.name} backend defines {name} in "
            f"{spec.module_path!r}, not {module_path!r}"
        )
