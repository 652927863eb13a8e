import pytest

from accel.contract import ConfigError
from accel.vllm.tpu.topology import parse_slice


@pytest.mark.parametrize(
    "accel,topo,chips_per_host,num_hosts,pod_type",
    [
        ("v5e", "4x4", 4, 4, "v5litepod-16"),
        ("v6e", "2x4", 8, 1, "v6e-8"),
        ("v6e", "1x1", 1, 1, "v6e-1"),
        ("v6e", "2x2", 4, 1, "v6e-4"),
        ("v6e", "16x16", 4, 64, "v6e-256"),
        ("v7x", "2x2x1", 4, 1, "v7x-8"),
        ("v7x", "2x2x2", 4, 2, "v7x-16"),
        ("v5p", "2x2x1", 4, 1, "v5p-8"),
        ("v5p", "4x4x8", 4, 32, "v5p-256"),
        ("TPU-V5LITEPOD", "8x8", 4, 16, "v5litepod-64"),
    ],
)
def test_known_shapes(accel, topo, chips_per_host, num_hosts, pod_type):
    sl = parse_slice(accel, topo)
    assert (sl.chips_per_host, sl.num_hosts) == (chips_per_host, num_hosts)
    assert sl.num_chips == chips_per_host * num_hosts
    assert sl.pod_type == pod_type
    assert sl.head_resource == f"TPU-{pod_type}-head"
    assert sl.is_multi_host == (num_hosts > 1)


def test_v5e_names_match_ray():
    sl = parse_slice("v5e", "4x4")
    assert sl.accelerator == "v5e"
    assert sl.ray_accelerator_version == "v5litepod"
    assert sl.ray_accelerator_type == "TPU-V5LITEPOD"


def test_v6e_2x4_as_two_hosts():
    sl = parse_slice("v6e", "2x4", chips_per_host=4)
    assert (sl.num_hosts, sl.chips_per_host, sl.num_chips) == (2, 4, 8)


@pytest.mark.parametrize(
    "accel,topo,needle",
    [
        ("v6e", "3x3", "no 3x3 slice"),
        ("v6e", "2x8", "no 2x8 slice"),
        ("v5e", "2x2x1", "2D"),
        ("v7x", "4x4", "3D"),
        ("v7x", "2x2x3", "no 2x2x3"),
        ("v5p", "4x4x6", "no 4x4x6"),
        ("v5p", "8x4x4", "no 8x4x4"),
        ("v7x", "16x16x16", "no 16x16x16"),
        ("v6e", "2xfour", "AxB"),
        ("v6e", "0x4", "2D"),
        ("v4", "2x2x1", "unknown TPU generation"),
    ],
)
def test_impossible_shapes_refused(accel, topo, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_slice(accel, topo)


def test_chips_per_host_override_only_where_it_exists():
    with pytest.raises(ConfigError, match="chips_per_host"):
        parse_slice("v6e", "4x4", chips_per_host=8)
    with pytest.raises(ConfigError, match="chips_per_host"):
        parse_slice("v7x", "2x2x1", chips_per_host=2)


def test_agrees_with_ray_table():
    """Every shape we accept is one Ray 2.60 can reserve, with the same chips per host."""
    from ray._private.accelerators.tpu import VALID_TPU_TOPOLOGY, get_chips_per_host

    from accel.vllm.tpu import topology as topo_mod

    for gen in topo_mod._GENERATIONS.values():
        for shape in set(gen.single_host) | gen.multi_host:
            assert shape in VALID_TPU_TOPOLOGY[gen.ray_version], (gen.name, shape)
            assert parse_slice(gen.name, shape).chips_per_host == get_chips_per_host(shape, gen.ray_version)
