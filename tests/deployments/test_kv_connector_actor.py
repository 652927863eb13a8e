"""The KV-connector actor on a small real Ray cluster, through the engines' transport."""

import time

import pytest
import torch

from accel.kv_transfer.payload import KVDescriptor, KVPayload
from accel.kv_transfer.transport import KVCapacityError, KVTransferError, KVTransferNotFound

ray = pytest.importorskip("ray")

from deployments.kv_connector_actor import (KVConnectorConfig, get_kv_connector,  # noqa: E402
                                            get_or_create_kv_connector, kill_kv_connector)
from deployments.kv_connector_client import RayKVTransport  # noqa: E402

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


def _stats(app_name):
    return ray.get(get_kv_connector(app_name).stats.remote())["registry"]


def test_put_fetch_complete_round_trip(app):
    get_or_create_kv_connector(app)
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


def test_payload_survives_the_producer_dropping_its_reference(app):
    """The actor's borrowed reference keeps the payload alive after the producer forgets it."""
    get_or_create_kv_connector(app)
    payload = _payload(seed=3)
    RayKVTransport(app).put("t1", payload, timeout_s=5)
    import gc
    gc.collect()
    assert torch.equal(RayKVTransport(app).fetch("t1", timeout_s=5).kv, payload.kv)


def test_lease_expiry_frees_payload(app):
    get_or_create_kv_connector(app, KVConnectorConfig(lease_s=1.0))
    transport = RayKVTransport(app)
    transport.put("t1", _payload(), timeout_s=5)
    deadline = time.time() + 15  # lease 1 s, sweeper every second; generous for a loaded machine
    while _stats(app)["num_transfers"] and time.time() < deadline:
        time.sleep(0.2)
    stats = _stats(app)
    assert stats["num_transfers"] == 0 and stats["num_bytes_used"] == 0 and stats["num_expired"] == 1
    with pytest.raises(KVTransferNotFound, match="lease expired"):
        transport.fetch("t1", timeout_s=5)


def test_capacity_full_backpressure_nothing_dropped(app):
    size = _payload().descriptor.num_bytes
    get_or_create_kv_connector(app, KVConnectorConfig(capacity_bytes=2 * size))
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
    get_or_create_kv_connector(app)
    transport = RayKVTransport(app)
    transport.put("t1", _payload(), timeout_s=5)
    ray.kill(get_kv_connector(app))
    time.sleep(0.5)
    with pytest.raises(KVTransferError):
        transport.fetch("t1", timeout_s=5)
    transport.report_recompute("actor_dead")  # must not raise with the actor gone


def test_prefix_tier_shares_blocks_between_clients(app):
    handle = get_or_create_kv_connector(app, KVConnectorConfig(prefix_tier_bytes=4 * MIB))
    block = torch.arange(16.0)
    refs = [ray.put(block.numpy())]
    assert ray.get(handle.offer_prefix.remote("fp", 16, [7], refs, 64)) == 1
    found = ray.get(handle.match_prefix.remote("fp", 16, [7, 8]))
    assert len(found) == 1 and torch.equal(torch.from_numpy(ray.get(found[0])), block)
    assert ray.get(handle.stats.remote())["prefix_tier"]["num_hits"] == 1
