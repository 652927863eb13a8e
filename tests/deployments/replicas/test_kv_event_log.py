"""The engine replica's KV event log: cursor reads, ring overflow and foreign cursors force a
snapshot, several readers see the same stream, reading never consumes."""

from __future__ import annotations

import threading

import pytest

from deployments.messages.kv_events import BlockRemoved, BlockStored, KVCursor
from deployments.replicas.kv_event_log import KVEventLog


def _stored(*hashes):
    return BlockStored(tuple(hashes))


def test_cursor_reads_the_events_after_it():
    log = KVEventLog(capacity_events=8)
    assert log.read(None) is None  # no cursor: resync from a snapshot
    head = log.append([_stored(1), _stored(2)])
    assert head == KVCursor(log.log_id, 2) and log.head == head
    assert log.read(KVCursor(log.log_id, 0)) == (_stored(1), _stored(2))
    assert log.read(KVCursor(log.log_id, 1)) == (_stored(2),)
    assert log.read(head) == ()
    log.append([BlockRemoved((1,))])
    assert log.read(head) == (BlockRemoved((1,)),)
    assert log.read(head) == (BlockRemoved((1,)),)  # a lost answer is read again: nothing consumed


def test_overflow_and_foreign_cursors_need_a_snapshot():
    log = KVEventLog(capacity_events=3)
    log.append([_stored(i) for i in range(1, 6)])  # seqs 1..5, only 3..5 kept
    assert log.first_seq == 3
    assert log.read(KVCursor(log.log_id, 1)) is None  # event 2 fell off
    assert log.read(KVCursor(log.log_id, 2)) == (_stored(3), _stored(4), _stored(5))
    assert log.read(KVCursor(log.log_id, 9)) is None  # ahead of the head: not this log's history
    # A restarted replica starts a new log: a cursor into the old one never reads here, even
    # when its seq happens to be valid.
    restarted = KVEventLog(capacity_events=3)
    restarted.append([_stored(7), _stored(8), _stored(9)])
    assert restarted.read(KVCursor(log.log_id, 2)) is None


def test_two_readers_see_the_same_stream():
    log = KVEventLog(capacity_events=64)
    cursors = {"router-a": KVCursor(log.log_id, 0), "router-b": KVCursor(log.log_id, 0)}
    seen = {name: [] for name in cursors}
    for batch in range(10):
        log.append([_stored(batch, 100 + batch), BlockRemoved((batch,))])
        # router-a polls after every batch, router-b every third: same events, same order.
        for name in cursors:
            if name == "router-a" or batch % 3 == 2 or batch == 9:
                seen[name].extend(log.read(cursors[name]))
                cursors[name] = log.head
    assert seen["router-a"] == seen["router-b"] and len(seen["router-a"]) == 20


def test_concurrent_appends_keep_seq_and_order_consistent():
    log = KVEventLog(capacity_events=10_000)

    def writer(base):
        for i in range(500):
            log.append([_stored(base + i)])

    threads = [threading.Thread(target=writer, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events = log.read(KVCursor(log.log_id, 0))
    assert log.head.seq == 2000 and len(events) == 2000
    for k in range(4):  # each writer's events in its own order
        mine = [e.block_hashes[0] for e in events if k * 1000 <= e.block_hashes[0] < (k + 1) * 1000]
        assert mine == [k * 1000 + i for i in range(500)]


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        KVEventLog(capacity_events=0)
