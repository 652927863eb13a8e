"""The shared-memory KV store without Ray: commit atomicity, exact byte ledger under concurrent
producers (threads and another process), backpressure, leases, recycling, teardown."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from accel.kv_transfer.payload import KVDescriptor, KVPayload
from accel.kv_transfer.shm_format import TransferHeader, file_name
from accel.kv_transfer.shm_store import ShmKVStore, ShmStoreConfig
from accel.kv_transfer.transport import KVCapacityError, KVTransferError

REPO = Path(__file__).resolve().parents[3]


def _payload(num_tokens=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    desc = KVDescriptor.for_prompt("fp", dtype, 2, 2, 8, list(range(num_tokens)), 8)
    return KVPayload(desc, torch.randn(desc.shape, generator=g).to(dtype))  # 16 tokens fp32: 4 KiB


SIZE = _payload().descriptor.num_bytes


@pytest.fixture
def root(tmp_path):
    # tmp_path is not tmpfs, which only makes the store slower; semantics are the same.
    return tmp_path / "meshserve-kv-test"


def _store(root, capacity=10 * SIZE, lease_s=30.0):
    return ShmKVStore.create(root, ShmStoreConfig(capacity, lease_s, 1 << 30))


def _files(root):
    return {sub: sorted(os.listdir(root / sub)) for sub in ("tmp", "data", "spare")}


def test_round_trip_zero_copy_and_complete_frees(root):
    store = _store(root)
    payload = _payload(seed=1)
    store.put("req-1.abc", payload, timeout_s=1)
    got = store.fetch("req-1.abc")
    assert got.descriptor == payload.descriptor and torch.equal(got.kv, payload.kv)
    assert not got.kv.is_contiguous() or got.kv.data_ptr() % 64 == 0  # page-aligned view of the file
    s = store.snapshot()
    assert (s.num_live, s.bytes_live, s.num_committed, s.bytes_committed) == (1, SIZE, 1, SIZE)
    assert store.complete("req-1.abc")
    s = store.snapshot()
    assert (s.num_live, s.bytes_live, s.num_completed) == (0, 0, 1)
    assert store.fetch("req-1.abc") is None and not store.contains("req-1.abc")
    assert not store.complete("req-1.abc")  # twice is a no-op
    assert len(store.drain_latencies()) == 1 and store.drain_latencies() == []


def test_bfloat16_and_odd_ids(root):
    store = _store(root)
    payload = _payload(dtype=torch.bfloat16)
    tid = "weird/../id with spaces ✓"
    store.put(tid, payload, timeout_s=1)
    assert torch.equal(store.fetch(tid).kv, payload.kv)
    assert _files(root)["data"] == [file_name(tid)]


def test_commit_is_atomic_readers_never_see_a_reserved_transfer(root):
    """Between reserve and commit the transfer exists only under tmp/: invisible to consumers."""
    store = _store(root)
    payload = _payload()
    encoded_header = TransferHeader("t", payload.descriptor, time.time()).encode()
    fd = store._reserve("t", SIZE, encoded_header, timeout_s=1)
    try:
        assert store.fetch("t") is None and not store.contains("t")
        assert store.snapshot().bytes_live == SIZE  # but its bytes are already reserved
        with pytest.raises(KVTransferError, match="already exists"):
            store.put("t", payload, timeout_s=1)
    finally:
        os.close(fd)
    store.cancel("t")
    assert store.snapshot().bytes_live == 0 and _files(root)["tmp"] == []


def test_backpressure_waits_then_succeeds_when_space_frees(root):
    store = _store(root, capacity=2 * SIZE)
    store.put("a", _payload(seed=1), timeout_s=1)
    store.put("b", _payload(seed=2), timeout_s=1)
    threading.Timer(0.3, store.complete, args=("a",)).start()
    t0 = time.monotonic()
    store.put("c", _payload(seed=3), timeout_s=5)
    assert 0.25 <= time.monotonic() - t0 < 4
    assert torch.equal(store.fetch("b").kv, _payload(seed=2).kv)  # nothing dropped
    assert torch.equal(store.fetch("c").kv, _payload(seed=3).kv)
    s = store.snapshot()
    assert s.bytes_live == 2 * SIZE and s.bytes_live + s.bytes_spare <= s.capacity_bytes


def test_deadline_raises_capacity_error_and_counts_it(root):
    store = _store(root, capacity=SIZE)
    store.put("a", _payload(), timeout_s=1)
    t0 = time.monotonic()
    with pytest.raises(KVCapacityError, match="full"):
        store.put("b", _payload(), timeout_s=0.3)
    assert time.monotonic() - t0 >= 0.28
    with pytest.raises(KVCapacityError, match="whole capacity"):
        store.put("huge", _payload(num_tokens=64), timeout_s=5)  # never fits: no waiting
    s = store.snapshot()
    assert (s.num_rejected_capacity, s.num_rejected_too_large, s.bytes_live) == (1, 1, SIZE)
    assert torch.equal(store.fetch("a").kv, _payload().kv)


def test_ledger_exact_under_concurrent_threads(root):
    store = _store(root, capacity=3 * SIZE)
    errors = []

    def worker(w):
        try:
            for i in range(15):
                tid = f"w{w}-{i}"
                store.put(tid, _payload(seed=w), timeout_s=20)
                assert torch.equal(store.fetch(tid).kv, _payload(seed=w).kv)
                assert store.complete(tid)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    s = store.snapshot()
    assert (s.num_live, s.bytes_live, s.num_committed, s.num_completed) == (0, 0, 90, 90)
    assert s.bytes_spare <= s.capacity_bytes


_CHILD = """
import sys, torch
from pathlib import Path
sys.path.insert(0, {repo!r})
from accel.kv_transfer.shm_store import ShmKVStore
from tests.accel.kv_transfer.test_shm_store import _payload
store = ShmKVStore.open(Path({path!r}))
for i in range(20):
    store.put(f"child-{{i}}", _payload(seed=i), timeout_s=20)
    if i % 2:
        assert store.complete(f"child-{{i}}")
"""


def test_ledger_exact_with_a_producer_in_another_process(root):
    store = _store(root, capacity=16 * SIZE)  # child keeps 10 + 1 in flight, parent <= 3
    child = subprocess.Popen([sys.executable, "-c", _CHILD.format(repo=str(REPO), path=str(root))])
    for i in range(20):
        store.put(f"parent-{i}", _payload(seed=100 + i), timeout_s=20)
        if i % 2:
            assert store.complete(f"parent-{i}")
        elif i >= 4:  # keep the parent's share bounded so both fit: complete an older even one
            assert store.complete(f"parent-{i - 4}")
    assert child.wait(timeout=60) == 0
    s = store.snapshot()
    live = len(os.listdir(root / "data"))
    assert s.num_live == live and s.bytes_live == live * SIZE
    assert s.num_committed == 40 and s.num_completed == 40 - live
    for i in range(0, 20, 2):  # the child's even transfers are intact
        assert torch.equal(store.fetch(f"child-{i}").kv, _payload(seed=i).kv)


def test_lease_sweep_expires_and_recounts(root):
    store = _store(root, lease_s=0.2)
    store.put("a", _payload(), timeout_s=1)
    store.put("b", _payload(), timeout_s=1)
    store.fetch("b")  # renews b's lease
    time.sleep(0.15)
    store.fetch("b")
    time.sleep(0.1)
    assert store.sweep() == 1  # a only
    assert store.contains("b") and not store.contains("a")
    time.sleep(0.25)
    assert store.sweep() == 1
    s = store.snapshot()
    assert (s.num_live, s.bytes_live, s.num_expired) == (0, 0, 2)
    assert _files(root)["data"] == [] and _files(root)["spare"] == []  # expired files are never recycled


def test_sweep_drops_idle_spare_files(root):
    store = _store(root, lease_s=0.2)
    store.put("a", _payload(), timeout_s=1)
    store.complete("a")
    assert len(_files(root)["spare"]) == 1
    store.sweep()
    assert len(_files(root)["spare"]) == 1  # recently used: kept for the next put
    time.sleep(0.3)
    store.sweep()
    assert _files(root)["spare"] == [] and store.snapshot().bytes_spare == 0


def test_sweep_recounts_a_ledger_left_wrong_by_a_crash(root):
    store = _store(root)
    store.put("a", _payload(), timeout_s=1)
    with store.ledger.locked() as s:  # as if a process died between its file change and ledger write
        s.num_live, s.bytes_live = 5, 5 * SIZE
    store.sweep()
    assert (store.snapshot().num_live, store.snapshot().bytes_live) == (1, SIZE)


def test_complete_recycles_only_files_nobody_maps(root):
    store = _store(root)
    payload = _payload(seed=1)
    store.put("a", payload, timeout_s=1)
    held = store.fetch("a")  # a consumer that keeps its view past complete
    store.complete("a")
    assert len(_files(root)["spare"]) == 1
    store.put("b", _payload(seed=2), timeout_s=1)  # must not reuse the still-mapped file
    assert torch.equal(held.kv, payload.kv)
    assert len(_files(root)["spare"]) == 1
    del held
    store.complete("b")
    store.put("c", _payload(seed=3), timeout_s=1)  # now a spare is free to reuse
    assert len(_files(root)["spare"]) == 1
    assert torch.equal(store.fetch("c").kv, _payload(seed=3).kv)


def test_consumer_after_unlink_finds_nothing(root):
    store = _store(root)
    store.put("a", _payload(), timeout_s=1)
    os.unlink(root / "data" / file_name("a"))
    assert store.fetch("a") is None and not store.complete("a")


def test_adopting_an_existing_store_keeps_transfers_and_applies_config(root):
    store = _store(root, capacity=4 * SIZE)
    store.put("a", _payload(), timeout_s=1)
    again = _store(root, capacity=8 * SIZE, lease_s=5.0)
    assert again.snapshot().capacity_bytes == 8 * SIZE and again.snapshot().lease_s == 5.0
    assert torch.equal(again.fetch("a").kv, _payload().kv)
    assert ShmKVStore.open(root / "missing") is None


def test_teardown_removes_the_directory(root):
    store = _store(root)
    store.put("a", _payload(), timeout_s=1)
    store.destroy()
    assert not root.exists()
    with pytest.raises(OSError):
        store.put("b", _payload(), timeout_s=1)
