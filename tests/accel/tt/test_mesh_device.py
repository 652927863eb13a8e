"""MESH_DEVICE presets and the open/close sequence, against the ttnn stub."""

from __future__ import annotations

import pytest

from accel.tt.mesh_device import MESH_PRESETS, TTNN_CALLS, MeshDeviceConfig, close_mesh, open_mesh, parse_mesh_grid


@pytest.mark.parametrize(
    "name,grid",
    [
        ("N150", (1, 1)),
        ("P100", (1, 1)),
        ("P150", (1, 1)),
        ("N300", (1, 2)),
        ("P300", (1, 2)),
        ("P150x2", (1, 2)),
        ("N150x4", (1, 4)),
        ("P150x4", (1, 4)),
        ("P300x2", (1, 4)),
        ("T3K", (1, 8)),
        ("P150x8", (1, 8)),
        ("TG", (8, 4)),
        ("BH-Galaxy", (8, 4)),
        ("(2, 4)", (2, 4)),
        ("(1,1)", (1, 1)),
    ],
)
def test_presets_and_literals(name, grid):
    assert parse_mesh_grid(name) == grid


def test_unset_and_unknown():
    assert parse_mesh_grid(None, num_devices=4) == (1, 4)
    with pytest.raises(ValueError, match="device count is unknown"):
        parse_mesh_grid(None)
    with pytest.raises(ValueError) as err:
        parse_mesh_grid("N999")
    assert "'N999'" in str(err.value) and all(name in str(err.value) for name in MESH_PRESETS)
    with pytest.raises(ValueError):
        parse_mesh_grid("(0, 4)")


def test_config_validation():
    with pytest.raises(ValueError, match="dispatch_core_axis"):
        MeshDeviceConfig(grid=(1, 1), dispatch_core_axis="diagonal")
    assert MeshDeviceConfig(grid=(8, 4)).num_devices == 32


def _calls_within_declared_table(ttnn):
    for name, _args, kwargs in ttnn._stub_calls:
        assert name in TTNN_CALLS, f"undeclared ttnn call {name}"
        assert set(kwargs) <= set(TTNN_CALLS[name]), f"{name} called with undeclared {set(kwargs)}"


def test_single_device_opens_without_fabric(ttnn_stub):
    ttnn = ttnn_stub
    ttnn._stub_simulate(1, ttnn.cluster.ClusterType.N150)
    mesh = open_mesh(ttnn, MeshDeviceConfig(grid=(1, 1), trace_region_size=1234))
    names = [c[0] for c in ttnn._stub_calls]
    assert names == ["open_mesh_device"]  # no fabric, no cluster-type query on one chip
    kwargs = ttnn._stub_calls[0][2]
    assert kwargs["mesh_shape"] == ttnn.MeshShape(1, 1) and kwargs["trace_region_size"] == 1234
    assert kwargs["dispatch_core_config"] is None
    close_mesh(ttnn, mesh)
    assert [c[0] for c in ttnn._stub_calls] == ["open_mesh_device", "close_mesh_device"]
    _calls_within_declared_table(ttnn)


@pytest.mark.parametrize(
    "cluster,expected", [("GALAXY", "FABRIC_1D_RING"), ("BLACKHOLE_GALAXY", "FABRIC_2D_TORUS_XY"), ("T3K", "FABRIC_1D")]
)
def test_multi_device_default_fabric(ttnn_stub, cluster, expected):
    ttnn = ttnn_stub
    ttnn._stub_simulate(32, getattr(ttnn.cluster.ClusterType, cluster))
    config = MeshDeviceConfig(
        grid=(8, 4), dispatch_core_axis="col", worker_l1_size=1344544, trace_region_size=220000000
    )
    mesh = open_mesh(ttnn, config)
    fabric_call = next(c for c in ttnn._stub_calls if c[0] == "set_fabric_config")
    assert fabric_call[2]["config"] is getattr(ttnn.FabricConfig, expected)
    assert fabric_call[2]["reliability_mode"] is ttnn.FabricReliabilityMode.STRICT_INIT
    open_call = next(c for c in ttnn._stub_calls if c[0] == "open_mesh_device")[2]
    assert repr(open_call["mesh_shape"]) == "MeshShape([8, 4])"
    assert open_call["dispatch_core_config"].axis is ttnn.DispatchCoreAxis.COL
    assert (open_call["worker_l1_size"], open_call["trace_region_size"]) == (1344544, 220000000)
    mesh.device.create_submeshes(ttnn.MeshShape(2, 4))
    ttnn._stub_calls.clear()
    close_mesh(ttnn, mesh)
    names = [c[0] for c in ttnn._stub_calls]
    assert names == ["close_mesh_device"] * 5 + ["set_fabric_config"]  # 4 submeshes, mesh, fabric off
    assert ttnn._stub_calls[-1][2]["config"] is ttnn.FabricConfig.DISABLED
    _calls_within_declared_table(ttnn)


def test_explicit_fabric_and_bad_member(ttnn_stub):
    ttnn = ttnn_stub
    ttnn._stub_simulate(8, ttnn.cluster.ClusterType.T3K)
    open_mesh(ttnn, MeshDeviceConfig(grid=(1, 8), fabric_config="FABRIC_2D", fabric_reliability_mode="RELAXED_INIT"))
    assert "cluster.get_cluster_type" not in [c[0] for c in ttnn._stub_calls]
    assert ttnn._stub_calls[0][2]["config"] is ttnn.FabricConfig.FABRIC_2D
    with pytest.raises(ValueError, match="FABRIC_3D.*valid"):
        open_mesh(ttnn, MeshDeviceConfig(grid=(1, 8), fabric_config="FABRIC_3D"))


def test_without_chips_the_stub_raises_like_the_wheel(ttnn_stub):
    with pytest.raises(RuntimeError, match="No chips detected"):
        open_mesh(ttnn_stub, MeshDeviceConfig(grid=(1, 1)))


def test_from_tt_options():
    from types import SimpleNamespace

    opts = SimpleNamespace(
        fabric_config="FABRIC_2D",
        fabric_reliability_mode="RELAXED_INIT",
        dispatch_core_axis="col",
        worker_l1_size=1344544,
        trace_region_size=None,
        l1_small_size=None,
        trace_mode="all",
    )
    cfg = MeshDeviceConfig.from_tt_options(opts)
    assert cfg.grid is None and cfg.trace_region_size == 50_000_000 and cfg.l1_small_size == 0
    assert (cfg.fabric_config, cfg.dispatch_core_axis, cfg.worker_l1_size) == ("FABRIC_2D", "col", 1344544)
    assert MeshDeviceConfig.from_tt_options(SimpleNamespace(trace_mode="none"), grid=(1, 2)).trace_region_size == 0
