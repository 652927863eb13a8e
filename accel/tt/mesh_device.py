"""Opening and closing a Tenstorrent mesh with ttnn: MESH_DEVICE presets, fabric, dispatch axis.

Every ttnn function and keyword this package calls is declared in ``TTNN_CALLS`` /
``TTNN_ATTRIBUTES``; ``tests/accel/tt/test_ttnn_signatures.py`` checks the table against the real
``ttnn`` 0.81.1 wheel, and the stub-based tests check that our calls stay inside the table. The
``ttnn`` module is always passed in (never imported here), so this file imports without ttnn.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

# vllm-tt-plugin utils/dp_discovery.py presets (TG/BH-Galaxy: the worker's (8, 4) grid).
MESH_PRESETS: dict[str, tuple[int, int]] = {
    "N150": (1, 1),
    "P100": (1, 1),
    "P150": (1, 1),
    "N300": (1, 2),
    "P300": (1, 2),
    "P150x2": (1, 2),
    "N150x4": (1, 4),
    "P150x4": (1, 4),
    "P300x2": (1, 4),
    "T3K": (1, 8),
    "P150x8": (1, 8),
    "TG": (8, 4),
    "BH-Galaxy": (8, 4),
}
_LITERAL_GRID = re.compile(r"^\(?\s*(\d+)\s*,\s*(\d+)\s*\)?$")

# (function, keywords we pass) for every ttnn call we make; dotted names are attributes of ttnn.
TTNN_CALLS: dict[str, tuple[str, ...]] = {
    "get_num_devices": (),
    "cluster.get_cluster_type": (),
    "set_fabric_config": ("config", "reliability_mode"),
    "MeshShape": (),  # positional (rows, cols)
    "DispatchCoreConfig": ("axis",),
    "open_mesh_device": ("mesh_shape", "dispatch_core_config", "trace_region_size", "worker_l1_size", "l1_small_size"),
    "close_mesh_device": ("mesh_device",),
    "record_event": ("mesh_device", "cq_id"),
    "event_synchronize": ("mesh_event",),
    "synchronize_device": ("device",),  # the health check's device probe (health.device_probe)
    "MeshDevice.get_submeshes": (),
}
TTNN_ATTRIBUTES: tuple[str, ...] = (
    "FabricConfig.DISABLED",
    "FabricConfig.FABRIC_1D",
    "FabricConfig.FABRIC_1D_RING",
    "FabricConfig.FABRIC_2D_TORUS_XY",
    "FabricReliabilityMode.STRICT_INIT",
    "FabricReliabilityMode.RELAXED_INIT",
    "DispatchCoreAxis.ROW",
    "DispatchCoreAxis.COL",
    "cluster.ClusterType.GALAXY",
    "cluster.ClusterType.BLACKHOLE_GALAXY",
    "bfloat8_b",
    "bfloat16",
    "float32",  # KV cache dtypes (model_setup.kv_dtype)
)

DEFAULT_TRACE_REGION_BYTES = 50_000_000


def parse_mesh_grid(mesh_device: str | None, num_devices: int | None = None) -> tuple[int, int]:
    """A ``MESH_DEVICE`` value -> (rows, cols). Unset -> ``(1, num_devices)``."""
    if mesh_device is None or not mesh_device.strip():
        if num_devices is None:
            raise ValueError("MESH_DEVICE is unset and the device count is unknown")
        return (1, num_devices)
    name = mesh_device.strip()
    if name in MESH_PRESETS:
        return MESH_PRESETS[name]
    match = _LITERAL_GRID.match(name)
    if match and int(match.group(1)) > 0 and int(match.group(2)) > 0:
        return (int(match.group(1)), int(match.group(2)))
    raise ValueError(
        f"unknown MESH_DEVICE {mesh_device!r}; expected one of {sorted(MESH_PRESETS)} or a literal grid '(rows, cols)'"
    )


@dataclass(frozen=True)
class MeshDeviceConfig:
    """How to open the mesh (``additional_config.tt`` keys, vLLM-spelled). ``grid`` None: from
    ``MESH_DEVICE``, else every chip present (resolved by ``open_backend``)."""

    grid: tuple[int, int] | None = None
    fabric_config: str | None = None  # a ttnn.FabricConfig member name; None = default for the cluster
    fabric_reliability_mode: str = "STRICT_INIT"
    dispatch_core_axis: str | None = None  # "row" | "col"
    trace_region_size: int = DEFAULT_TRACE_REGION_BYTES
    worker_l1_size: int = 0
    l1_small_size: int = 0

    def __post_init__(self) -> None:
        if self.grid is not None and (len(self.grid) != 2 or min(self.grid) < 1):
            raise ValueError(f"mesh grid must be (rows, cols) >= 1, got {self.grid}")
        if self.dispatch_core_axis not in (None, "row", "col"):
            raise ValueError(f"dispatch_core_axis must be 'row' or 'col', got {self.dispatch_core_axis!r}")

    @property
    def num_devices(self) -> int:
        rows, cols = self.resolved_grid
        return rows * cols

    @property
    def resolved_grid(self) -> tuple[int, int]:
        if self.grid is None:
            raise ValueError("mesh grid not resolved yet")
        return self.grid

    @staticmethod
    def from_tt_options(options: Any, grid: tuple[int, int] | None = None) -> MeshDeviceConfig:
        """From the engine's ``additional_config.tt`` options (attributes ``fabric_config``,
        ``fabric_reliability_mode``, ``dispatch_core_axis``, ``worker_l1_size``,
        ``trace_region_size``, ``l1_small_size``, ``trace_mode``; None = default). No trace region
        is reserved when ``trace_mode == "none"``."""

        def opt(name: str, default: Any) -> Any:
            value = getattr(options, name, None)
            return default if value is None else value

        is_tracing = opt("trace_mode", "all") != "none"
        return MeshDeviceConfig(
            grid=grid,
            fabric_config=opt("fabric_config", None),
            fabric_reliability_mode=opt("fabric_reliability_mode", "STRICT_INIT"),
            dispatch_core_axis=opt("dispatch_core_axis", None),
            trace_region_size=opt("trace_region_size", DEFAULT_TRACE_REGION_BYTES if is_tracing else 0),
            worker_l1_size=opt("worker_l1_size", 0),
            l1_small_size=opt("l1_small_size", 0),
        )


@dataclass(frozen=True)
class OpenedMesh:
    device: Any  # ttnn.MeshDevice
    grid: tuple[int, int]
    has_fabric: bool  # a fabric was set and must be disabled on close


def default_fabric_name(ttnn: Any) -> str:
    """WH Galaxy -> FABRIC_1D_RING, Blackhole Galaxy -> FABRIC_2D_TORUS_XY, else FABRIC_1D.
    Calls ``cluster.get_cluster_type()``, which needs hardware: multi-device opens only."""
    cluster_type = ttnn.cluster.get_cluster_type()
    if cluster_type == ttnn.cluster.ClusterType.GALAXY:
        return "FABRIC_1D_RING"
    if cluster_type == ttnn.cluster.ClusterType.BLACKHOLE_GALAXY:
        return "FABRIC_2D_TORUS_XY"
    return "FABRIC_1D"


def open_mesh(ttnn: Any, config: MeshDeviceConfig) -> OpenedMesh:
    has_fabric = config.num_devices > 1
    if has_fabric:
        fabric_name = config.fabric_config or default_fabric_name(ttnn)
        ttnn.set_fabric_config(
            config=_member(ttnn.FabricConfig, fabric_name, "fabric_config"),
            reliability_mode=_member(
                ttnn.FabricReliabilityMode, config.fabric_reliability_mode, "fabric_reliability_mode"
            ),
        )
    dispatch = None
    if config.dispatch_core_axis is not None:
        dispatch = ttnn.DispatchCoreConfig(
            axis=_member(ttnn.DispatchCoreAxis, config.dispatch_core_axis.upper(), "dispatch_core_axis")
        )
    device = ttnn.open_mesh_device(
        mesh_shape=ttnn.MeshShape(*config.resolved_grid),
        dispatch_core_config=dispatch,
        trace_region_size=config.trace_region_size,
        worker_l1_size=config.worker_l1_size,
        l1_small_size=config.l1_small_size,
    )
    logger.info("opened TT mesh %s (fabric %s)", config.grid, "on" if has_fabric else "off")
    return OpenedMesh(device, config.resolved_grid, has_fabric)


def close_mesh(ttnn: Any, mesh: OpenedMesh) -> None:
    """Submeshes first, then the mesh, then the fabric (the plugin's order)."""
    for submesh in mesh.device.get_submeshes():
        ttnn.close_mesh_device(mesh_device=submesh)
    ttnn.close_mesh_device(mesh_device=mesh.device)
    if mesh.has_fabric:
        ttnn.set_fabric_config(
            config=ttnn.FabricConfig.DISABLED, reliability_mode=ttnn.FabricReliabilityMode.STRICT_INIT
        )


def _member(enum: Any, name: str, key: str) -> Any:
    try:
        return getattr(enum, name)
    except AttributeError:
        valid = [n for n in dir(enum) if n.isupper()]
        raise ValueError(
            f"{key}={name!r} is not a member of ttnn.{getattr(enum, '__name__', enum)}; valid: {valid}"
        ) from None
