import pytest

from accel.contract import ConfigError
from accel.vllm.tpu.placement import SlicePlacement
from accel.vllm.tpu.topology import parse_slice


def test_v5e_4x4_defers_to_a_slice_placement_group():
    p = SlicePlacement(parse_slice("v5e", "4x4"), num_cpus_per_host=1, replica_num_cpus=1)
    assert p.is_deferred
    assert p.bundles == ({"TPU": 4.0, "CPU": 2.0},) + ({"TPU": 4.0, "CPU": 1.0},) * 3
    assert p.host_bundle == {"TPU": 4.0, "CPU": 1.0}
    assert (
        p.bundle_label_selector
        == ({"ray.io/accelerator-type": "TPU-V5LITEPOD", "ray.io/tpu-pod-type": "v5litepod-16"},) * 4
    )
    # Serve must not create the group: the replica reserves a whole slice at start.
    assert p.deployment_options() == {"ray_actor_options": {"num_cpus": 1}}


def test_v5e_4x4_pinned_to_named_slice_is_static():
    p = SlicePlacement(parse_slice("v5e", "4x4"), slice_name="slice-a", replica_num_cpus=0.5)
    opts = p.deployment_options()
    assert not p.is_deferred
    assert opts["placement_group_bundles"] == [{"TPU": 4.0, "CPU": 1.5}] + [{"TPU": 4.0, "CPU": 1.0}] * 3
    assert opts["placement_group_strategy"] == "SPREAD"
    assert len(opts["placement_group_bundle_label_selector"]) == 4
    for sel in opts["placement_group_bundle_label_selector"]:
        assert sel["ray.io/tpu-slice-name"] == "slice-a"
    assert opts["ray_actor_options"] == {"num_cpus": 0.5}


def test_v6e_2x4_single_host_eight_chips():
    p = SlicePlacement(parse_slice("v6e", "2x4"), num_cpus_per_host=0, replica_num_cpus=1)
    opts = p.deployment_options()
    assert opts["placement_group_bundles"] == [{"TPU": 8.0, "CPU": 1.0}]
    # Single host: no pod-type pin (a replica may use part of a bigger VM), no slice name needed.
    assert opts["placement_group_bundle_label_selector"] == [{"ray.io/accelerator-type": "TPU-V6E"}]


def test_v7x_2x2x1():
    p = SlicePlacement(parse_slice("v7x", "2x2x1"))
    assert not p.is_deferred
    assert p.bundles == ({"TPU": 4.0, "CPU": 2.0},)
    assert p.bundle_label_selector == ({"ray.io/accelerator-type": "TPU-V7X"},)


def test_deployment_options_accepted_by_serve():
    """Serve's own schema validates what we produce (bundle selectors match bundles)."""
    from ray.serve.schema import DeploymentSchema

    for p in (
        SlicePlacement(parse_slice("v6e", "2x4")),
        SlicePlacement(parse_slice("v6e", "4x4"), slice_name="s1"),
        SlicePlacement(parse_slice("v6e", "4x4")),
    ):
        DeploymentSchema(name="TPUEngine", **p.deployment_options())


def test_bad_reservations_refused():
    with pytest.raises(ConfigError):
        SlicePlacement(parse_slice("v6e", "2x4"), num_cpus_per_host=-1)
    with pytest.raises(ConfigError, match="placement_group_strategy"):
        SlicePlacement(parse_slice("v6e", "2x4"), strategy="RANDOM")


def test_per_chip_backend_gets_one_bundle_per_chip():
    """torchtpu: one worker process per chip asking {"TPU": 1}; static bundles match it."""
    p = SlicePlacement(
        parse_slice("v6e", "4x4"), num_cpus_per_host=2, replica_num_cpus=1, slice_name="s", workers="per_chip"
    )
    opts = p.deployment_options()
    assert opts["placement_group_bundles"] == [{"TPU": 1.0, "CPU": 1.5}] + [{"TPU": 1.0, "CPU": 0.5}] * 15
    assert opts["placement_group_strategy"] == "PACK"
    assert len(opts["placement_group_bundle_label_selector"]) == 16
    assert all(sel["ray.io/tpu-slice-name"] == "s" for sel in opts["placement_group_bundle_label_selector"])
    single = SlicePlacement(parse_slice("v6e", "2x4"), workers="per_chip")
    assert single.deployment_options()["placement_group_strategy"] == "STRICT_PACK"
    assert len(single.bundles) == 8
    # deferred: Ray's per-host slice bundles (torchtpu packs chips_per_host workers into each)
    deferred = SlicePlacement(parse_slice("v6e", "4x4"), workers="per_chip")
    assert deferred.is_deferred and deferred.host_bundle == {"TPU": 4.0, "CPU": 1.0}
