"""Import-compatible stand-in for the ``ttnn`` 0.81.1 wheel, for host tests (never on sys.path by
default: tests that need it prepend ``tests/doubles/stubs`` with monkeypatch).

Like the real wheel without hardware, every device function raises ``RuntimeError`` ("TT_FATAL ...
No chips detected in the cluster"). Names and parameter names follow the real signatures
(``tests/accel/tt/test_ttnn_signatures.py`` compares them). Tests may simulate a machine with
``_stub_simulate(num_chips, cluster_type)``; every device call is then recorded in ``_stub_calls``
as ``(name, args, kwargs)``. A process a test cannot call into (a ``serve run`` replica) starts
simulating from its environment: ``TTNN_STUB_SIMULATE=<num_chips>:<ClusterType name>`` (``8:T3K``).
"""

from __future__ import annotations

import enum
import os
from typing import Any

from ttnn import cluster

_NO_CHIPS = (
    "TT_FATAL @ /project/tt_metal/llrt/tt_cluster.cpp:129: num_chips > 0\ninfo:\n"
    "No chips detected in the cluster\nbacktrace:\n --- (stub) tt::Cluster::Cluster(...)\n"
)

_stub_state: dict[str, Any] = {"num_chips": 0}
_stub_calls: list[tuple[str, tuple, dict]] = []


def _stub_simulate(num_chips: int, cluster_type: cluster.ClusterType | None = None) -> None:
    _stub_state["num_chips"] = num_chips
    cluster._cluster_type = cluster_type
    _stub_calls.clear()


def _device_call(name: str, *args: Any, **kwargs: Any) -> None:
    if _stub_state["num_chips"] < 1:
        raise RuntimeError(_NO_CHIPS)
    _stub_calls.append((name, args, kwargs))


class FabricConfig(enum.Enum):
    DISABLED = 0
    FABRIC_1D = 1
    FABRIC_1D_RING = 2
    FABRIC_1D_NEIGHBOR_EXCHANGE = 3
    FABRIC_2D = 4
    FABRIC_2D_TORUS_XY = 5
    FABRIC_2D_TORUS_X = 6
    FABRIC_2D_TORUS_Y = 7
    CUSTOM = 8


class FabricReliabilityMode(enum.Enum):
    STRICT_INIT = 0
    RELAXED_INIT = 1
    DYNAMIC_RECONFIG = 2


class FabricTensixConfig(enum.Enum):
    DISABLED = 0


class DispatchCoreAxis(enum.Enum):
    ROW = 0
    COL = 1


class DispatchCoreType(enum.Enum):
    WORKER = 0
    ETH = 1


class DataType(enum.Enum):
    BFLOAT16 = 0
    FLOAT32 = 1
    UINT32 = 2
    BFLOAT8_B = 3
    BFLOAT4_B = 4


bfloat16 = DataType.BFLOAT16
float32 = DataType.FLOAT32
bfloat8_b = DataType.BFLOAT8_B
bfloat4_b = DataType.BFLOAT4_B


class MeshShape:
    def __init__(self, *dims: int) -> None:
        if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
            dims = tuple(dims[0])
        self.dims = tuple(int(d) for d in dims)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MeshShape) and other.dims == self.dims

    def __repr__(self) -> str:
        return f"MeshShape({list(self.dims)})"


class DispatchCoreConfig:
    def __init__(
        self,
        type: DispatchCoreType | None = None,
        axis: DispatchCoreAxis | None = None,
        fabric_tensix_config: Any = None,
    ) -> None:
        self.type, self.axis, self.fabric_tensix_config = type, axis, fabric_tensix_config


class MeshEvent:
    def __init__(self, mesh_device: MeshDevice, cq_id: int | None) -> None:
        self.mesh_device, self.cq_id = mesh_device, cq_id


class MeshDevice:
    def __init__(self, shape: MeshShape) -> None:
        self.shape = shape
        self._submeshes: list[MeshDevice] = []

    def get_num_devices(self) -> int:
        return self.shape.dims[0] * self.shape.dims[1]

    def create_submeshes(self, submesh_shape: MeshShape) -> list[MeshDevice]:
        rows, cols = self.shape.dims
        count = (rows * cols) // (submesh_shape.dims[0] * submesh_shape.dims[1])
        self._submeshes = [MeshDevice(submesh_shape) for _ in range(count)]
        return list(self._submeshes)

    def get_submeshes(self) -> list[MeshDevice]:
        return list(self._submeshes)


def using_distributed_env() -> bool:
    return False


def get_num_devices() -> int:
    _device_call("get_num_devices")
    return _stub_state["num_chips"]


def GetNumAvailableDevices() -> int:
    return get_num_devices()


def get_num_pcie_devices() -> int:
    return get_num_devices()


def set_fabric_config(
    config: FabricConfig,
    reliability_mode: FabricReliabilityMode = FabricReliabilityMode.STRICT_INIT,
    num_planes: int | None = None,
    fabric_tensix_config: Any = None,
    fabric_udm_mode: Any = None,
    fabric_manager_mode: Any = None,
    router_config: Any = None,
) -> None:
    if config is not FabricConfig.DISABLED:
        _device_call("set_fabric_config", config=config, reliability_mode=reliability_mode)
    else:
        _stub_calls.append(("set_fabric_config", (), {"config": config, "reliability_mode": reliability_mode}))


def open_mesh_device(
    mesh_shape: MeshShape | None = None,
    l1_small_size: int = 0,
    trace_region_size: int = 0,
    num_command_queues: int = 1,
    dispatch_core_config: DispatchCoreConfig | None = None,
    offset: Any = None,
    physical_device_ids: list[int] = [],  # noqa: B006 (ttnn 0.81.1's own default)
    worker_l1_size: int = 0,
) -> MeshDevice:
    _device_call(
        "open_mesh_device",
        mesh_shape=mesh_shape,
        l1_small_size=l1_small_size,
        trace_region_size=trace_region_size,
        dispatch_core_config=dispatch_core_config,
        worker_l1_size=worker_l1_size,
    )
    return MeshDevice(mesh_shape or MeshShape(1, _stub_state["num_chips"]))


def close_mesh_device(mesh_device: MeshDevice) -> None:
    _device_call("close_mesh_device", mesh_device=mesh_device)


def record_event(
    mesh_device: MeshDevice,
    cq_id: int | None = None,
    sub_device_ids: list = [],  # noqa: B006 (ttnn 0.81.1's own default)
    device_range: Any = None,
) -> MeshEvent:
    _device_call("record_event", mesh_device=mesh_device, cq_id=cq_id)
    return MeshEvent(mesh_device, cq_id)


def event_synchronize(mesh_event: MeshEvent) -> None:
    _device_call("event_synchronize", mesh_event=mesh_event)


def wait_for_event(cq_id: int, mesh_event: MeshEvent) -> None:
    _device_call("wait_for_event", cq_id, mesh_event)


def synchronize_device(device: MeshDevice, cq_id: int | None = None, sub_device_ids: list = []) -> None:  # noqa: B006 (ttnn 0.81.1's own default)
    _device_call("synchronize_device", device, cq_id=cq_id)


def begin_trace_capture(mesh_device: MeshDevice, *, cq_id: int | None = None) -> int:
    _device_call("begin_trace_capture", mesh_device, cq_id=cq_id)
    return 0


def end_trace_capture(mesh_device: MeshDevice, trace_id: int, *, cq_id: int | None = None) -> None:
    _device_call("end_trace_capture", mesh_device, trace_id, cq_id=cq_id)


def execute_trace(mesh_device: MeshDevice, trace_id: int, *, cq_id: int | None = None, blocking: bool = True) -> None:
    _device_call("execute_trace", mesh_device, trace_id, cq_id=cq_id, blocking=blocking)


def release_trace(mesh_device: MeshDevice, trace_id: int) -> None:
    _device_call("release_trace", mesh_device, trace_id)


if os.environ.get("TTNN_STUB_SIMULATE"):
    _chips, _, _type = os.environ["TTNN_STUB_SIMULATE"].partition(":")
    _stub_simulate(int(_chips), cluster.ClusterType[_type] if _type else None)
