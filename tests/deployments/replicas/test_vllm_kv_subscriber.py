"""The KV-event subscriber against vLLM's real ZMQ publisher (no engine): batches are rekeyed to
``accel.block_hash``, the snapshot is the fold of the events, batches published before the
subscriber connected are fetched from the replay socket."""

from __future__ import annotations

import time

import pytest

from accel.block_hash import hash_prompt_blocks
from deployments.messages.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from deployments.replicas.vllm_kv_subscriber import VllmKVEventSubscriber, kv_events_config, new_ipc_endpoint

vllm_events = pytest.importorskip("vllm.distributed.kv_events")
BS = 4
TOKENS = list(range(10, 34))  # 6 blocks


def _stored(vllm_hashes, parent, tokens):
    return vllm_events.BlockStored(
        block_hashes=vllm_hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=BS,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )


def _batch(*events):
    return vllm_events.KVEventBatch(ts=time.time(), events=list(events))


@pytest.fixture
def endpoint():
    return new_ipc_endpoint()


@pytest.fixture
def publisher(endpoint):
    config = kv_events_config(endpoint)
    pub = vllm_events.ZmqEventPublisher(
        0, endpoint=config["endpoint"], replay_endpoint=config["replay_endpoint"], topic=config["topic"]
    )
    yield pub
    pub.shutdown()


def _wait_for(predicate, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_events_rekeyed_and_snapshot_is_their_fold(endpoint, publisher):
    ours = hash_prompt_blocks(TOKENS, BS)
    sub = VllmKVEventSubscriber(endpoint, BS)
    try:
        time.sleep(0.3)  # let the SUB join (replay would cover it anyway)
        publisher.publish(_batch(_stored([b"v0", b"v1", b"v2", b"v3"], None, TOKENS[:16])))
        publisher.publish(
            _batch(
                _stored([b"v4", b"v5"], b"v3", TOKENS[16:24]),
                vllm_events.BlockRemoved(block_hashes=[b"v1"], medium="GPU"),
            )
        )
        assert _wait_for(lambda: sub.num_batches == 2)
        assert sub.take_events() == (
            BlockStored(tuple(ours[:4])),
            BlockStored(tuple(ours[4:])),
            BlockRemoved((ours[1],)),
        )
        assert sub.take_events() == ()
        assert sub.snapshot() == (ours[0], ours[2], ours[3], ours[4], ours[5])
        publisher.publish(_batch(vllm_events.AllBlocksCleared()))
        assert _wait_for(lambda: sub.num_batches == 3)
        assert sub.take_events() == (AllBlocksCleared(),) and sub.snapshot() == ()
        assert sub.num_missed_batches == 0
    finally:
        sub.close()


def test_the_snapshot_keeps_each_blocks_fastest_tier(endpoint, publisher):
    """A device eviction the host tier survives: the block stays in the snapshot, listed in
    ``snapshot_tiers`` as host-held, until it is loaded back onto the device."""
    ours = hash_prompt_blocks(TOKENS, BS)
    sub = VllmKVEventSubscriber(endpoint, BS)
    try:
        time.sleep(0.3)
        offload = vllm_events.BlockStored(
            block_hashes=[b"v1"],
            parent_block_hash=None,
            token_ids=[],
            block_size=0,
            lora_id=None,
            medium="CPU",
            lora_name=None,
        )
        publisher.publish(
            _batch(
                _stored([b"v0", b"v1"], None, TOKENS[:8]),
                offload,
                vllm_events.BlockRemoved(block_hashes=[b"v0", b"v1"], medium="GPU"),
            )
        )
        assert _wait_for(lambda: sub.num_batches == 1)
        assert sub.snapshot() == (ours[1],) and sub.snapshot_tiers() == ((ours[1], "host"),)
        publisher.publish(_batch(_stored([b"v1"], b"v0", TOKENS[4:8])))
        assert _wait_for(lambda: sub.num_batches == 2)
        assert sub.snapshot() == (ours[1],) and sub.snapshot_tiers() == ()
    finally:
        sub.close()


def test_batches_published_before_connecting_are_replayed(endpoint, publisher):
    ours = hash_prompt_blocks(TOKENS, BS)
    publisher.publish(_batch(_stored([b"v0", b"v1"], None, TOKENS[:8])))  # nobody listens yet
    time.sleep(0.3)
    sub = VllmKVEventSubscriber(endpoint, BS)
    try:
        time.sleep(0.3)
        publisher.publish(_batch(_stored([b"v2"], b"v1", TOKENS[8:12])))  # seq 1: gap -> replay seq 0
        assert _wait_for(lambda: sub.num_batches == 2)
        assert sub.take_events() == (BlockStored(tuple(ours[:2])), BlockStored((ours[2],)))
        assert sub.snapshot() == tuple(ours[:3])
        assert sub.num_missed_batches == 0 and sub.num_skipped_blocks == 0
    finally:
        sub.close()
