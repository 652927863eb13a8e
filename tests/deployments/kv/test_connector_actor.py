"""The KV-connector actor on a small real Ray cluster, through the engines' transport. Most tests
run over both data paths: the node's shared-memory store (the default for payloads this size)
and the object store (``shm_max_payload_bytes=0``)."""

import time

import pytest
import torch

from accel.kv_transfer.payload import KVDescriptor, KVPayload
from accel.kv_transfer.transport import KVCapacityError, KVTransferError, KVTransferNotFound

ray = pytest.importorskip("ray")

from deployments.kv.connector_actor import (  # noqa: E402
    KVConnectorConfig,
    get_kv_connector,
    get_or_create_kv_connector,
    kill_kv_connector,
)
from deployments.kv.ray_transport import RayKVTransport  # noqa: E402

MIB = 1 << 20


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", num_cpus=1, object_store_memory=100 * MIB, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _payload(num_tokens=64, seed=0):
    torch.manual_seed(seed)
    desc = KVDescriptor.for_prompt("fp", torch.float32, 4, 2, 32, list(range(num_tokens)), 16)
    return KVPayload(desc, torch.randn(desc.shape))  # 64 tokens: 4*2*64*2*32*4 = 128 KiB


@pytest.fixture
def app(ray_cluster, request):
    name = request.node.name.replace("[", "_").replace("]", "_")
    yield name
    kill_kv_connector(name)


@pytest.fixture(params=["shm", "object"])
def data_path(request):
    return request.param


def _config(data_path, **kwargs):
    return KVConnectorConfig(**kwargs, **({} if data_path == "shm" else {"shm_max_payload_bytes": 0}))


def _stats(app_name):
    return get_kv_connector(app_name).stats()["registry"]


def test_put_fetch_complete_round_trip(app, data_path):
    get_or_create_kv_connector(app, _config(data_path))
    transport = RayKVTransport(app)
    payload = _payload()
    transport.put("t1", payload, timeout_s=5)
    got = transport.fetch("t1", timeout_s=5)
    assert got.descriptor == payload.descriptor and torch.equal(got.kv, payload.kv)
    assert _stats(app)["num_bytes_used"] == payload.descriptor.num_bytes
    transport.complete("t1")
    deadline = time.time() + 5
    while _stats(app)["num_transfers"] and time.time() < deadline:
        time.sleep(0.05)
    assert _stats(app)["num_bytes_used"] == 0
    with pytest.raises(KVTransferNotFound):
        transport.fetch("t1", timeout_s=5)


def test_payload_survives_the_producer_dropping_its_reference(app, data_path):
    """The actor's borrowed reference (object store) or the file (shared memory) keeps the
    payload alive after the producer forgets it."""
    get_or_create_kv_connector(app, _config(data_path))
    payload = _payload(seed=3)
    RayKVTransport(app).put("t1", payload, timeout_s=5)
    import gc

    gc.collect()
    assert torch.equal(RayKVTransport(app).fetch("t1", timeout_s=5).kv, payload.kv)


def test_lease_expiry_frees_payload(app, data_path):
    get_or_create_kv_connector(app, _config(data_path, lease_s=1.0))
    transport = RayKVTransport(app)
    transport.put("t1", _payload(), timeout_s=5)
    deadline = time.time() + 15  # lease 1 s, sweeper every second; generous for a loaded machine
    while _stats(app)["num_transfers"] and time.time() < deadline:
        time.sleep(0.2)
    stats = _stats(app)
    assert stats["num_transfers"] == 0 and stats["num_bytes_used"] == 0 and stats["num_expired"] == 1
    with pytest.raises(KVTransferNotFound, match="lease expired"):
        transport.fetch("t1", timeout_s=5)


def test_capacity_full_backpressure_nothing_dropped(app, data_path):
    size = _payload().descriptor.num_bytes
    get_or_create_kv_connector(app, _config(data_path, capacity_bytes=2 * size))
    transport = RayKVTransport(app)
    transport.put("a", _payload(seed=1), timeout_s=5)
    transport.put("b", _payload(seed=2), timeout_s=5)
    t0 = time.monotonic()
    with pytest.raises(KVCapacityError, match="full"):
        transport.put("c", _payload(seed=3), timeout_s=0.5)
    assert time.monotonic() - t0 >= 0.45, "the put must wait for space before failing"
    # Nothing was dropped or overwritten to make room.
    assert torch.equal(transport.fetch("a", 5).kv, _payload(seed=1).kv)
    assert torch.equal(transport.fetch("b", 5).kv, _payload(seed=2).kv)
    assert _stats(app)["num_rejected"] == 1
    transport.complete("a")
    transport.put("c", _payload(seed=3), timeout_s=5)  # fits once "a" is gone
    assert torch.equal(transport.fetch("c", 5).kv, _payload(seed=3).kv)


def test_actor_killed_mid_transfer_fails_cleanly(app):
    """Object-store path: the payload dies with the actor's reference; the consumer learns it."""
    get_or_create_kv_connector(app, _config("object"))
    transport = RayKVTransport(app)
    transport.put("t1", _payload(), timeout_s=5)
    ray.kill(get_kv_connector(app).handle)
    time.sleep(0.5)
    with pytest.raises(KVTransferError):
        transport.fetch("t1", timeout_s=5)
    transport.report_recompute("actor_dead")  # must not raise with the actor gone


def _actor_pid(app_name):
    import os

    return ray.get(get_kv_connector(app_name).handle.__ray_call__.remote(lambda self: os.getpid()), timeout=60)


def test_crashed_actor_is_restarted_and_found_again(app):
    """Its process killed (a crash, not ``kill_kv_connector``): Ray restarts it under the same
    name. The object-store transfer it held is lost (the consumer recomputes); the same transport
    then stores and reads through the restarted actor, and the lost payload's lease is not held."""
    import os
    import signal

    get_or_create_kv_connector(app, _config("object"))
    transport = RayKVTransport(app)
    transport.put("t1", _payload(), timeout_s=5)
    pid = _actor_pid(app)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(KVTransferError):
        transport.fetch("t1", timeout_s=30)
    transport.report_recompute("actor_dead")
    deadline = time.time() + 60
    while True:  # calls fail fast (ActorUnavailableError) while Ray restarts it
        try:
            if _actor_pid(app) != pid:
                break
        except ray.exceptions.RayError:
            pass
        assert time.time() < deadline, "the actor was not restarted"
        time.sleep(0.2)
    payload = _payload(seed=3)
    transport.put("t2", payload, timeout_s=30)
    assert torch.equal(transport.fetch("t2", timeout_s=30).kv, payload.kv)
    transport.complete("t2")
    deadline = time.time() + 10
    while _stats(app)["num_transfers"] and time.time() < deadline:
        time.sleep(0.1)
    stats = _stats(app)
    assert stats["num_transfers"] == 0 and stats["num_bytes_used"] == 0 and stats["num_completed"] == 1


def test_shared_memory_transfer_survives_the_actor(app):
    """Shared-memory path: the transfer lives in the node's store, not in the actor, so killing
    the actor mid-transfer loses nothing; a restarted actor adopts the store and sweeps it."""
    get_or_create_kv_connector(app, KVConnectorConfig(lease_s=2.0))
    payload = _payload(seed=5)
    RayKVTransport(app).put("t1", payload, timeout_s=5)
    RayKVTransport(app).put("t2", payload, timeout_s=5)
    ray.kill(get_kv_connector(app).handle)
    time.sleep(0.5)
    transport = RayKVTransport(app)  # a fresh consumer, as after a replica restart
    assert torch.equal(transport.fetch("t1", timeout_s=5).kv, payload.kv)
    transport.complete("t1")
    transport.put("t3", payload, timeout_s=5)  # producers keep working without the actor
    transport.report_recompute("actor_dead")  # must not raise with the actor gone
    get_or_create_kv_connector(app, KVConnectorConfig(lease_s=2.0))
    assert _stats(app)["num_transfers"] == 2  # t2 and t3, found in the store
    deadline = time.time() + 15
    while _stats(app)["num_transfers"] and time.time() < deadline:
        time.sleep(0.2)
    stats = _stats(app)
    assert stats["num_transfers"] == 0 and stats["num_bytes_used"] == 0 and stats["num_expired"] == 2


def test_consumer_on_another_node_pulls_through_a_pinned_task(app, tmp_path):
    """A consumer whose node store lacks the transfer asks the actor where it is and reads it
    there. Simulated on one machine: the consumer's "node" keeps its store under another root."""
    get_or_create_kv_connector(app)
    payload = _payload(seed=7)
    RayKVTransport(app, note_transfers=True).put("t1", payload, timeout_s=5)  # (one node: notes off by default)
    remote = RayKVTransport(app, shm_root=str(tmp_path))
    # At once: the producer's note reaches the actor in the background, and the actor waits for a
    # note in flight (NOTE_GRACE_S), as the decode side of a cross-node PD hand-off needs.
    assert torch.equal(remote.fetch("t1", timeout_s=30).kv, payload.kv)
    deadline = time.time() + 5
    remote.complete("t1")
    while _stats(app)["num_transfers"] and time.time() < deadline + 25:
        time.sleep(0.1)
    assert _stats(app)["num_completed"] == 1 and _stats(app)["num_bytes_used"] == 0
    with pytest.raises(KVTransferNotFound):
        remote.fetch("never-made", timeout_s=5)


def test_kill_removes_the_shared_memory_store(ray_cluster):
    from deployments.kv.connector_actor import shm_store_path

    get_or_create_kv_connector("teardown-app")
    RayKVTransport("teardown-app").put("t1", _payload(), timeout_s=5)
    assert shm_store_path("teardown-app").is_dir()
    kill_kv_connector("teardown-app")
    assert not shm_store_path("teardown-app").exists()


def test_prefix_tier_shares_blocks_between_clients(app):
    connector = get_or_create_kv_connector(app, KVConnectorConfig(prefix_tier_bytes=4 * MIB))
    block = torch.arange(16.0)
    refs = [ray.put(block.numpy())]
    assert connector.offer_prefix("fp", 16, [7], refs, 64) == 1
    found = connector.match_prefix("fp", 16, [7, 8], timeout_s=30)
    assert len(found) == 1 and torch.equal(torch.from_numpy(ray.get(found[0])), block)
    assert connector.stats()["prefix_tier"]["num_hits"] == 1


def test_stores_of_stopped_clusters_are_removed(ray_cluster):
    """A cluster stopped without kill_kv_connector leaves its store behind; the next actor on the
    node removes it (its GCS refuses connections), and leaves live clusters' stores alone."""
    import socket

    from deployments.kv.connector_actor import shm_store_path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]  # closed again: nothing listens there
    orphan = shm_store_path("orphan-app").with_name("meshserve-kv-orphan-app-0000000000")
    orphan.mkdir(parents=True)
    (orphan / "owner").write_text(f"127.0.0.1:{dead_port}")
    get_or_create_kv_connector("live-app")
    try:
        get_or_create_kv_connector("another-app")
        assert not orphan.exists()
        assert shm_store_path("live-app").is_dir()
    finally:
        kill_kv_connector("live-app")
        kill_kv_connector("another-app")
