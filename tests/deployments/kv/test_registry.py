import asyncio
import gc
import weakref

import pytest
import torch

from accel.kv_transfer.payload import KVDescriptor
from accel.kv_transfer.transport import KVCapacityError, KVTransferError, KVTransferNotFound
from deployments.kv.prefix_tier import KVPrefixTier
from deployments.kv.registry import KVRegistry


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Recorder:
    def __init__(self):
        self.events = []

    def __getattr__(self, name):
        return lambda *args: self.events.append((name, *args))


class Payload:  # stands in for the ObjectRef the actor keeps
    pass


def _desc(num_tokens=8):
    return KVDescriptor.for_prompt("fp", torch.float32, 1, 1, 4, list(range(num_tokens)), 4)  # 32 bytes/token


def _registry(capacity=1000, lease_s=30.0):
    clock, metrics = FakeClock(), Recorder()
    return KVRegistry(capacity, lease_s, clock, metrics), clock, metrics


async def _put(reg, tid, num_tokens=8, timeout_s=0.05, payload=None):
    desc = _desc(num_tokens)
    await reg.reserve(tid, desc.num_bytes, timeout_s)
    reg.commit(tid, desc, payload if payload is not None else Payload())
    return desc


def test_put_claim_complete_frees():
    async def run():
        reg, clock, metrics = _registry()
        desc = await _put(reg, "t1")
        assert reg.stats().num_bytes_used == desc.num_bytes == 8 * 2 * 4 * 4 == 256
        got, _ = reg.claim("t1")
        assert got == desc
        clock.now += 1.5
        reg.complete("t1")
        assert reg.stats().num_bytes_used == 0 and reg.stats().num_transfers == 0
        assert ("on_complete", desc.num_bytes, 1.5) in metrics.events
        with pytest.raises(KVTransferNotFound):
            reg.claim("t1")

    asyncio.run(run())


def test_lease_expiry_frees_the_payload():
    async def run():
        reg, clock, metrics = _registry(lease_s=30.0)
        payload = Payload()
        ref = weakref.ref(payload)
        await _put(reg, "t1", payload=payload)
        del payload
        clock.now += 29.0
        reg.claim("t1")  # renews the lease
        clock.now += 29.0
        assert reg.contains("t1")
        clock.now += 1.0
        assert reg.expire() == ["t1"]
        gc.collect()
        assert ref() is None, "the registry still references an expired payload"
        assert reg.stats().num_bytes_used == 0 and reg.stats().num_expired == 1
        assert any(e[0] == "on_expire" for e in metrics.events)
        with pytest.raises(KVTransferNotFound, match="lease expired"):
            reg.claim("t1")

    asyncio.run(run())


def test_reservation_without_commit_expires_too():
    async def run():
        reg, clock, _ = _registry()
        await reg.reserve("t1", 100, 0.01)
        with pytest.raises(KVTransferNotFound, match="not committed"):
            reg.claim("t1")
        clock.now += 31
        assert reg.expire() == ["t1"] and reg.stats().num_bytes_used == 0

    asyncio.run(run())


def test_capacity_full_backpressure_then_clear_failure():
    """A put that does not fit waits; when space frees in time it succeeds, otherwise it fails
    loudly — every put ends committed or with an error, none vanishes."""

    async def run():
        reg, clock, metrics = _registry(capacity=3 * 256)  # three 8-token transfers of 256 bytes
        for i in range(3):
            await _put(reg, f"t{i}")
        waiter = asyncio.create_task(_put(reg, "t3", timeout_s=5.0))
        await asyncio.sleep(0.05)
        assert not waiter.done(), "a put into a full store must wait, not drop or overwrite"
        reg.complete("t0")
        await asyncio.wait_for(waiter, 1.0)
        assert reg.contains("t3") and reg.stats().num_transfers == 3

        with pytest.raises(KVCapacityError, match="full"):
            await _put(reg, "t4", timeout_s=0.05)
        assert not reg.contains("t4") and reg.stats().num_rejected == 1
        assert ("on_reject", "capacity") in metrics.events
        # the rejected put freed nothing and took nothing
        assert all(reg.contains(t) for t in ("t1", "t2", "t3"))

    asyncio.run(run())


def test_waiting_put_proceeds_when_a_lease_expires():
    async def run():
        reg, clock, _ = _registry(capacity=256, lease_s=30.0)
        await _put(reg, "old")
        waiter = asyncio.create_task(_put(reg, "new", timeout_s=5.0))
        await asyncio.sleep(0.02)
        clock.now += 31
        reg.expire()
        await asyncio.wait_for(waiter, 1.0)
        assert reg.contains("new") and not reg.contains("old")

    asyncio.run(run())


def test_oversized_and_duplicate_puts_fail():
    async def run():
        reg, _, _ = _registry(capacity=100)
        with pytest.raises(KVCapacityError, match="whole capacity"):
            await reg.reserve("big", 101, 1.0)
        await reg.reserve("a", 10, 1.0)
        with pytest.raises(KVTransferError, match="already exists"):
            await reg.reserve("a", 10, 1.0)
        with pytest.raises(KVTransferError, match="exceeds its reservation"):
            reg.commit("a", _desc(8), Payload())
        reg.cancel("a")
        assert reg.stats().num_bytes_used == 0

    asyncio.run(run())


def test_prefix_tier_longest_leading_run_and_lru():
    tier = KVPrefixTier(capacity_bytes=300)
    assert tier.offer("fp", 4, [11, 12, 13], ["a", "b", "c"], 100) == 3
    assert tier.match("fp", 4, [11, 12, 99, 13]) == ["a", "b"]
    assert tier.match("other-model", 4, [11]) == []
    assert tier.match("fp", 8, [11]) == []  # another block size is another key
    tier.match("fp", 4, [11])  # 11 most recent; 13 least
    assert tier.offer("fp", 4, [14], ["d"], 100) == 1
    assert tier.match("fp", 4, [13]) == []  # evicted LRU
    assert tier.match("fp", 4, [11, 12, 14]) == ["a", "b", "d"]
    stats = tier.stats()
    assert stats.num_blocks == 3 and stats.num_bytes_used == 300 and stats.num_evicted == 1


def test_params_entry_is_claimed_once_and_holds_no_bytes():
    reg, clock, metrics = _registry()
    tpu = {"uuid": 7, "remote_host": "10.0.0.7", "remote_port": 9100}
    assert reg.put_params("t1", tpu) == clock.now + 30.0
    with pytest.raises(KVTransferError, match="already exists"):
        reg.put_params("t1", tpu)
    assert reg.stats().num_params == 1 and reg.stats().num_bytes_used == 0
    clock.now += 2.0
    assert reg.claim_params("t1") == tpu  # unchanged
    with pytest.raises(KVTransferNotFound):
        reg.claim_params("t1")  # one decode per prefill
    stats = reg.stats()
    assert stats.num_params == 0 and stats.num_params_claimed == 1
    assert ("on_complete", 0, 2.0) in metrics.events


def test_params_entry_expires_with_its_lease():
    reg, clock, metrics = _registry(lease_s=5.0)
    reg.put_params("t1", {"uuid": 1})
    clock.now += 5.0
    assert reg.expire() == ["t1"]
    with pytest.raises(KVTransferNotFound, match="lease expired"):
        reg.claim_params("t1")
    assert reg.stats().num_expired == 1 and reg.stats().num_params == 0
    assert ("on_expire", 0) in metrics.events
