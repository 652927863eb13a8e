"""A slice replica's placement group on a simulated multi-node Ray cluster with two TPU slices.

Each fake TPU host is a Ray node with ``TPU: 4``, the labels Ray sets on real TPU VMs
(accelerator type, pod type, slice name, worker id), the slice head resource on worker 0, and
``TPU_NAME`` in its environment (what Ray reads to name the slice). Runs in the default suite,
after everything else (``cluster`` marker: its own Ray cluster, tests/e2e/cluster.py).
"""

from __future__ import annotations

import pytest

from accel.vllm.tpu.placement import SlicePlacement, create_slice_placement_group
from accel.vllm.tpu.topology import parse_slice
from tests.e2e.cluster import simulated_cluster

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

SLICE = parse_slice("v7x", "2x2x2")  # 2 hosts x 4 chips
SLICE_NAMES = ("slice-a", "slice-b")


@pytest.fixture(scope="module")
def cluster():
    nodes, names = [], []
    for name in SLICE_NAMES:
        for worker_id in range(SLICE.num_hosts):
            resources = {"TPU": SLICE.chips_per_host, name: 1}
            if worker_id == 0:
                resources[SLICE.head_resource] = 1
            nodes.append(
                {
                    "num_cpus": 1,
                    "resources": resources,
                    "labels": {
                        "ray.io/accelerator-type": SLICE.ray_accelerator_type,
                        "ray.io/tpu-pod-type": SLICE.pod_type,
                        "ray.io/tpu-topology": SLICE.topology,
                        "ray.io/tpu-slice-name": name,
                        "ray.io/tpu-worker-id": str(worker_id),
                    },
                    "env_vars": {"TPU_NAME": name},
                }
            )
            names.append(name)
    with simulated_cluster({"num_cpus": 0}, nodes) as (_, handles):
        yield {node.node_id: name for node, name in zip(handles, names)}


def _slices_of(pg) -> list[str]:
    import ray
    from ray.util import placement_group_table

    ray.get(pg.ready(), timeout=60)
    return placement_group_table(pg)["bundles_to_node_id"]


def test_two_replicas_each_get_one_whole_slice(cluster):
    placement = SlicePlacement(SLICE, num_cpus_per_host=0.5, replica_num_cpus=0)
    assert placement.is_deferred
    handles = [create_slice_placement_group(placement, head_reservation_timeout_s=60) for _ in range(2)]
    try:
        used = []
        for h in handles:
            nodes = _slices_of(h.placement_group)
            assert len(nodes) == SLICE.num_hosts
            slices = {cluster[n] for n in nodes.values()}
            assert len(slices) == 1, f"one replica spans slices {slices}"
            assert len(set(nodes.values())) == SLICE.num_hosts  # one bundle per host
            used.append(slices.pop())
        assert sorted(used) == sorted(SLICE_NAMES)
    finally:
        for h in handles:
            h.shutdown()


def test_static_options_pinned_to_named_slice(cluster):
    """What Serve does with our static deployment options: the group lands on that slice only."""
    from ray.util.placement_group import placement_group, remove_placement_group

    opts = SlicePlacement(
        SLICE, num_cpus_per_host=0.5, replica_num_cpus=0.25, slice_name="slice-b"
    ).deployment_options()
    pg = placement_group(
        opts["placement_group_bundles"],
        strategy=opts["placement_group_strategy"],
        bundle_label_selector=opts["placement_group_bundle_label_selector"],
    )
    try:
        nodes = _slices_of(pg)
        assert {cluster[n] for n in nodes.values()} == {"slice-b"}
        assert len(set(nodes.values())) == SLICE.num_hosts
    finally:
        remove_placement_group(pg)


def test_unpinned_bundles_can_span_slices_but_slice_group_does_not(cluster):
    """Control: with one host of each slice busy, a plain group of the same bundles spans two
    slices; the slice placement group waits instead of splitting (times out here)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    blockers = [
        placement_group(
            [{"TPU": 4}], bundle_label_selector=[{"ray.io/tpu-slice-name": name, "ray.io/tpu-worker-id": wid}]
        )
        for name, wid in (("slice-a", "1"), ("slice-b", "0"))
    ]
    try:
        for b in blockers:
            ray.get(b.ready(), timeout=60)
        plain = placement_group([{"TPU": 4}] * SLICE.num_hosts, strategy="SPREAD")
        try:
            nodes = _slices_of(plain)
            assert {cluster[n] for n in nodes.values()} == set(SLICE_NAMES)  # spans both
        finally:
            remove_placement_group(plain)
        placement = SlicePlacement(SLICE, num_cpus_per_host=0, replica_num_cpus=0)
        with pytest.raises(TimeoutError, match="pending, as it must be"):
            # Both heads are free, but each slice has one busy host: whichever slice the head
            # reservation picks, the worker group must stay pending rather than borrow a host
            # of the other slice.
            h = create_slice_placement_group(placement, head_reservation_timeout_s=10)
            try:
                ready, _ = ray.wait([h.placement_group.ready()], timeout=10)
                if not ready:
                    raise TimeoutError("slice group pending, as it must be")
                nodes = placement_group_table_nodes(h.placement_group)
                pytest.fail(f"slice group placed across {nodes}")
            finally:
                h.shutdown()
    finally:
        for b in blockers:
            remove_placement_group(b)


def placement_group_table_nodes(pg):
    from ray.util import placement_group_table

    return placement_group_table(pg)["bundles_to_node_id"]


def test_replica_finds_its_slice_group(cluster):
    """From inside a replica-like actor: static mode returns the group the actor runs in,
    deferred mode reserves a whole slice."""
    import ray
    from ray.util import placement_group_table
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote(num_cpus=0)
    class Replica:
        def slice_group(self, placement):
            from accel.vllm.tpu.placement import replica_placement_group

            pg, handle = replica_placement_group(placement)
            ray.get(pg.ready(), timeout=60)
            nodes = placement_group_table(pg)["bundles_to_node_id"]
            if handle is not None:
                handle.shutdown()
            return pg.id.hex(), handle is not None, sorted(nodes.values())

    static = SlicePlacement(SLICE, num_cpus_per_host=0.5, replica_num_cpus=0.25, slice_name="slice-a")
    opts = static.deployment_options()
    pg = placement_group(
        opts["placement_group_bundles"],
        strategy=opts["placement_group_strategy"],
        bundle_label_selector=opts["placement_group_bundle_label_selector"],
    )
    try:
        ray.get(pg.ready(), timeout=60)
        actor = Replica.options(
            num_cpus=0.25,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
            ),
        ).remote()
        pg_id, is_deferred, nodes = ray.get(actor.slice_group.remote(static), timeout=120)
        assert pg_id == pg.id.hex() and not is_deferred
        assert {cluster[n] for n in nodes} == {"slice-a"}
        ray.kill(actor)
    finally:
        remove_placement_group(pg)

    actor = Replica.remote()
    deferred = SlicePlacement(SLICE, num_cpus_per_host=0.5, replica_num_cpus=0)
    _, is_deferred, nodes = ray.get(actor.slice_group.remote(deferred), timeout=180)
    assert is_deferred and len({cluster[n] for n in nodes}) == 1 and len(set(nodes)) == SLICE.num_hosts
    ray.kill(actor)


def _tpu_pool(tiny_llama):
    from accel.vllm.config import VllmEngineConfig
    from deployments.config.app import PoolConfig

    return PoolConfig(
        name="v7x",
        accelerator="tpu",
        model="tiny-llama",
        model_path=tiny_llama,
        max_model_len=512,
        engine_config=VllmEngineConfig(model=str(tiny_llama), max_model_len=512),
        num_cpus=0,
        tpu_type="v7x",
        tpu_topology="2x2x2",
    )


def test_replica_releases_its_slice_when_it_stops(cluster, tiny_llama):
    """A multi-host TPU replica reserves a whole slice when it starts and gives it back (worker
    group and slice-head reservation) when it shuts down, or when its engine fails to start. The
    engine is the HF-replay test double: the slice group's lifetime is the replica's, whatever
    engine runs in it (on this CPU host vLLM would run its CPU build anyway)."""
    import ray
    from ray.util import placement_group_table

    pool = _tpu_pool(tiny_llama)

    @ray.remote(num_cpus=0)
    class Host:
        async def start(self, pool, fail: bool):
            from deployments.replicas.vllm_replica import VllmReplica
            from tests.doubles.hf_replay_engine import HFReplayEngine

            def engine(p):
                if fail:
                    raise RuntimeError("engine failed to start")
                return HFReplayEngine(str(p.model_path), p.max_model_len, block_size=16)

            try:
                self.replica = VllmReplica(pool, engine_factory=engine)
            except RuntimeError as exc:
                return str(exc)
            pg = self.replica.slice_placement_group
            ray.get(pg.ready(), timeout=60)
            return pg.id.hex()

        async def stop(self):
            await self.replica.shutdown()

    def states() -> list[str]:
        return [pg["state"] for pg in placement_group_table().values() if pg["name"] == "v7x-slice"]

    host = Host.remote()
    pg_id = ray.get(host.start.remote(pool, False), timeout=180)
    table = placement_group_table()
    assert table[pg_id]["state"] == "CREATED"
    assert {cluster[n] for n in table[pg_id]["bundles_to_node_id"].values()} in ({"slice-a"}, {"slice-b"})
    ray.get(host.stop.remote(), timeout=60)
    _wait_for(lambda: placement_group_table()[pg_id]["state"] == "REMOVED")
    # Both whole slices are free again (the head reservation too): two fresh slice groups fit.
    handles = [
        create_slice_placement_group(SlicePlacement(SLICE, 0, 0), head_reservation_timeout_s=30) for _ in range(2)
    ]
    try:
        for h in handles:
            ray.get(h.placement_group.ready(), timeout=60)
    finally:
        for h in handles:
            h.shutdown()
    # An engine that fails to start leaves no reservation behind either.
    assert ray.get(host.start.remote(pool, True), timeout=180) == "engine failed to start"
    _wait_for(lambda: len(states()) == 2 and set(states()) == {"REMOVED"})  # (both starts' groups)
    ray.kill(host)


def _wait_for(condition, timeout_s: float = 30) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.2)
