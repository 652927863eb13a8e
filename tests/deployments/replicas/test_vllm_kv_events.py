import pytest

from accel.block_hash import hash_prompt_blocks
from accel.contract import ConfigError
from deployments.messages.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from deployments.replicas.vllm_kv_events import VLLMEventTranslator

vllm_events = pytest.importorskip("vllm.distributed.kv_events")
BS = 4
TOKENS = list(range(10, 34))  # 6 blocks


def stored(vllm_hashes, parent, tokens, **kw):
    fields = dict(lora_id=None, medium="GPU", lora_name=None)
    fields.update(kw)
    return vllm_events.BlockStored(
        block_hashes=vllm_hashes, parent_block_hash=parent, token_ids=tokens, block_size=BS, **fields
    )


def test_stored_chains_are_rekeyed_to_our_hashes_and_removed_through_the_table():
    ours = hash_prompt_blocks(TOKENS, BS)
    tr = VLLMEventTranslator(BS)
    # The engine stores the first 4 blocks, then 2 more chained on block 3 (vLLM's own hashes).
    first = tr.translate([stored([b"v0", b"v1", b"v2", b"v3"], None, TOKENS[:16])])
    second = tr.translate([stored([b"v4", b"v5"], b"v3", TOKENS[16:24])])
    assert first == [BlockStored(tuple(ours[:4]))] and second == [BlockStored(tuple(ours[4:]))]
    removed = tr.translate([vllm_events.BlockRemoved(block_hashes=[b"v5", b"unknown"], medium="GPU")])
    assert removed == [BlockRemoved((ours[5],))]
    assert tr.translate([vllm_events.AllBlocksCleared()]) == [AllBlocksCleared()]
    assert tr.translate([stored([b"v9"], b"v3", TOKENS[16:20])]) == []  # parent forgotten by the clear
    assert tr.num_skipped_blocks == 1


def test_blocks_we_cannot_key_are_skipped():
    tr = VLLMEventTranslator(BS)
    assert tr.translate([stored([b"a"], b"never-seen", TOKENS[:4])]) == []  # late subscriber
    assert tr.translate([stored([b"b"], None, TOKENS[:4], lora_id=3)]) == []
    assert tr.translate([stored([b"c"], None, TOKENS[:4], group_idx=1)]) == []  # another KV-cache group
    assert tr.translate([stored([b"d"], None, TOKENS[:4], extra_keys=[("img", 0)])]) == []
    assert tr.num_skipped_blocks == 4
    with pytest.raises(ConfigError, match="block_size"):
        VLLMEventTranslator(16).translate([stored([b"e"], None, TOKENS[:4])])
    with pytest.raises(TypeError):
        tr.translate([object()])


def offload_of(hashes, medium):
    """vLLM's offloading connectors' placeholder form: no tokens, block size 0."""
    return vllm_events.BlockStored(
        block_hashes=hashes,
        parent_block_hash=None,
        token_ids=[],
        block_size=0,
        lora_id=None,
        medium=medium,
        lora_name=None,
    )


def test_offloaded_blocks_stay_held_on_the_host_tier_until_no_medium_holds_them():
    """vLLM's offloading connectors publish the host tier's stores and evictions (medium "CPU")
    under the device blocks' own hashes: a prefix evicted from the device but kept in host DRAM
    is still held (the engine loads it back), now on the host tier, and leaves the index only
    when the host drops it."""
    ours = hash_prompt_blocks(TOKENS, BS)
    tr = VLLMEventTranslator(BS)
    assert tr.translate([stored([b"v0", b"v1", b"v2"], None, TOKENS[:12])]) == [BlockStored(tuple(ours[:3]))]
    # Offloaded copies (vLLM's placeholder form: no tokens, block size 0) change nothing yet:
    # the device is still the fastest tier holding them.
    assert tr.translate([offload_of([b"v1", b"v2"], "CPU")]) == []
    # Device evicts v0, v1, v2: v0 (never offloaded) goes; v1 and v2 are demoted to the host tier.
    gpu_evict = vllm_events.BlockRemoved(block_hashes=[b"v0", b"v1", b"v2"], medium="GPU")
    assert tr.translate([gpu_evict]) == [BlockRemoved((ours[0],)), BlockStored(tuple(ours[1:3]), tier="host")]
    # The host tier drops v2: now it is gone. v1 loaded back to the device is promoted.
    assert tr.translate([vllm_events.BlockRemoved(block_hashes=[b"v2"], medium="CPU")]) == [BlockRemoved((ours[2],))]
    assert tr.translate([stored([b"v1"], b"v0", TOKENS[4:8])]) == [BlockStored((ours[1],))]
    assert tr.translate([vllm_events.BlockRemoved(block_hashes=[b"v1"], medium="CPU")]) == []  # still on device


def test_each_run_of_blocks_is_reported_with_its_own_tier():
    """One vLLM event may move some blocks to a faster tier and find others already there: the
    translation is one ``BlockStored`` per run of equal tier, in chain order; other media than
    GPU and CPU (disk, a remote store) are the storage tier."""
    ours = hash_prompt_blocks(TOKENS, BS)
    tr = VLLMEventTranslator(BS)
    assert tr.translate([stored([b"v0", b"v1"], None, TOKENS[:8], medium="DISK")]) == [
        BlockStored(tuple(ours[:2]), tier="storage")
    ]
    assert tr.translate([offload_of([b"v1"], "CPU")]) == [BlockStored((ours[1],), tier="host")]
    # The device stores v0..v2: v0 and v1 are promoted, v2 is new; all three now on the device.
    assert tr.translate([stored([b"v0", b"v1", b"v2"], None, TOKENS[:12])]) == [BlockStored(tuple(ours[:3]))]
    evict = vllm_events.BlockRemoved(block_hashes=[b"v0", b"v1", b"v2"], medium="GPU")
    assert tr.translate([evict]) == [
        BlockRemoved((ours[2],)),
        BlockStored((ours[0],), tier="storage"),
        BlockStored((ours[1],), tier="host"),
    ]


def test_offload_event_with_tokens_keys_a_block_never_on_the_device():
    ours = hash_prompt_blocks(TOKENS, BS)
    tr = VLLMEventTranslator(BS)
    assert tr.translate([stored([b"h0"], None, TOKENS[:4], medium="CPU")]) == [BlockStored((ours[0],), tier="host")]
    assert tr.translate([offload_of([b"x"], "CPU")]) == [] and tr.num_skipped_blocks == 1


def test_a_cache_salt_starts_the_chain_at_the_salted_root():
    """vLLM publishes a request's cache_salt untagged as the first block's only extra key; our
    hashes then equal what the ingress computes for that salted request, and never the unsalted."""
    from accel.block_hash import salted_root

    salted = hash_prompt_blocks(TOKENS[:8], BS, salted_root("s3cret"))
    tr = VLLMEventTranslator(BS)
    out = tr.translate([stored([b"s0", b"s1"], None, TOKENS[:8], extra_keys=[("s3cret",), None])])
    assert out == [BlockStored(tuple(salted))]
    assert not set(salted) & set(hash_prompt_blocks(TOKENS[:8], BS))
    chained = tr.translate([stored([b"s2"], b"s1", TOKENS[8:12], extra_keys=[None])])
    assert chained == [BlockStored((hash_prompt_blocks(TOKENS[:12], BS, salted_root("s3cret"))[2],))]


def test_an_adapters_blocks_start_the_chain_at_the_adapters_root():
    """vLLM publishes an adapter request's lora_name as every block's first extra key (then the
    first block's cache_salt); our hashes equal what the ingress computes for that adapter's
    request, never the base model's or another adapter's."""
    from accel.block_hash import salted_root

    ours = hash_prompt_blocks(TOKENS[:12], BS, salted_root(None, "lora-a"))
    tr = VLLMEventTranslator(BS)
    keys = [("lora-a",), ("lora-a",)]
    out = tr.translate([stored([b"a0", b"a1"], None, TOKENS[:8], lora_id=1, lora_name="lora-a", extra_keys=keys)])
    assert out == [BlockStored(tuple(ours[:2]))]
    chained = tr.translate([stored([b"a2"], b"a1", TOKENS[8:12], lora_id=1, lora_name="lora-a", extra_keys=keys[:1])])
    assert chained == [BlockStored((ours[2],))]
    other = hash_prompt_blocks(TOKENS[:8], BS, salted_root(None, "lora-b"))
    assert not set(other) & set(ours) and not set(ours) & set(hash_prompt_blocks(TOKENS[:8], BS))
    salted = tr.translate(
        [stored([b"s0"], None, TOKENS[:4], lora_id=1, lora_name="lora-a", extra_keys=[("lora-a", "salt")])]
    )
    assert salted == [BlockStored((hash_prompt_blocks(TOKENS[:4], BS, salted_root("salt", "lora-a"))[0],))]
    # A block without the adapter's name among its keys cannot be keyed.
    assert tr.translate([stored([b"x"], None, TOKENS[:4], lora_id=1, lora_name="lora-a", extra_keys=None)]) == []
    assert tr.num_skipped_blocks == 1


def test_copies_on_one_medium_are_told_apart_by_ownership():
    """Two STORAGE tiers (vLLM's file-system and object-store tiering) hold a block: dropping it
    from one leaves it held on the other."""
    ours = hash_prompt_blocks(TOKENS, BS)
    tr = VLLMEventTranslator(BS)
    assert tr.translate([stored([b"v0"], None, TOKENS[:4], medium="STORAGE", ownership="fs")]) == [
        BlockStored((ours[0],), tier="storage")
    ]
    assert tr.translate([stored([b"v0"], None, TOKENS[:4], medium="STORAGE", ownership="obj")]) == []
    drop_fs = vllm_events.BlockRemoved(block_hashes=[b"v0"], medium="STORAGE", ownership="fs")
    assert tr.translate([drop_fs]) == []
    drop_obj = vllm_events.BlockRemoved(block_hashes=[b"v0"], medium="STORAGE", ownership="obj")
    assert tr.translate([drop_obj]) == [BlockRemoved((ours[0],))]
