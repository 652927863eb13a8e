"""BlockAllocator: allocation, ref counts, prefix hits, LRU eviction, KV events."""

from __future__ import annotations

import pytest

from accel.block_hash import hash_prompt_blocks
from accel.contract import PrefixCacheChange
from accel.tt.block_allocator import BlockAllocator


def test_allocate_and_free_return_every_block():
    allocator = BlockAllocator(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a = allocator.allocate(3)
    b = allocator.allocate(5)
    assert sorted(a + b) == list(range(8)) and allocator.num_free_blocks == 0
    with pytest.raises(RuntimeError):
        allocator.allocate(1)
    allocator.free(a)
    allocator.free(b)
    assert allocator.num_free_blocks == 8
    assert all(allocator.ref_count(i) == 0 for i in range(8))


def test_double_free_is_caught():
    allocator = BlockAllocator(4, 4, False)
    blocks = allocator.allocate(1)
    allocator.free(blocks)
    with pytest.raises(AssertionError):
        allocator.free(blocks)


def test_cached_prefix_is_found_and_shared():
    allocator = BlockAllocator(8, 4, True, lane=2)
    tokens = list(range(10, 22))  # 3 full blocks
    hashes = hash_prompt_blocks(tokens, 4)
    blocks = allocator.allocate(3)
    allocator.cache_blocks(blocks, hashes)
    assert allocator.take_kv_events() == [PrefixCacheChange("stored", 2, tuple(hashes))]
    # Still referenced: a second request sharing 2 blocks of prefix finds them.
    other = hash_prompt_blocks(tokens[:8] + [99, 98, 97, 96], 4)
    hit = allocator.find_cached_prefix(other)
    assert hit == blocks[:2]
    allocator.touch(hit)
    assert allocator.ref_count(blocks[0]) == 2
    allocator.free(blocks)
    allocator.free(hit)
    assert allocator.num_free_blocks == 8
    # Free but cached: still found, and touching takes them out of the free queue.
    hit = allocator.find_cached_prefix(hashes)
    assert hit == blocks
    assert allocator.num_free_after_touch(hit) == 5
    allocator.touch(hit)
    assert allocator.num_free_blocks == 5


def test_prefix_caching_off_finds_nothing_and_emits_nothing():
    allocator = BlockAllocator(4, 4, False)
    hashes = hash_prompt_blocks(list(range(8)), 4)
    blocks = allocator.allocate(2)
    allocator.cache_blocks(blocks, hashes)
    assert allocator.find_cached_prefix(hashes) == []
    assert allocator.take_kv_events() == []


def test_lru_eviction_takes_oldest_free_block_and_reports_removal():
    allocator = BlockAllocator(3, 2, True)
    blocks = allocator.allocate(3)
    hashes = hash_prompt_blocks([1, 2, 3, 4, 5, 6], 2)
    allocator.cache_blocks(blocks, hashes)
    allocator.take_kv_events()
    allocator.free([blocks[1]])  # freed first: least recently used
    allocator.free([blocks[0]])
    allocator.free([blocks[2]])
    (fresh,) = allocator.allocate(1)
    assert fresh == blocks[1]
    assert allocator.take_kv_events() == [PrefixCacheChange("removed", 0, (hashes[1],))]
    assert allocator.find_cached_prefix(hashes) == [blocks[0]]  # chain broken at block 1


def test_free_releases_tail_blocks_first():
    allocator = BlockAllocator(4, 2, True)
    blocks = allocator.allocate(4)
    allocator.cache_blocks(blocks, hash_prompt_blocks(list(range(8)), 2))
    allocator.free(blocks)
    # Reverse order: the last block of the sequence is evicted first, the prefix survives longest.
    assert allocator.allocate(1) == [blocks[3]]


def test_duplicate_hash_is_not_cached_twice():
    allocator = BlockAllocator(4, 2, True)
    h = hash_prompt_blocks([5, 6], 2)
    a, b = allocator.allocate(2)
    allocator.cache_blocks([a], h)
    allocator.cache_blocks([b], h)
    assert allocator.find_cached_prefix(h) == [a]
    assert [e.kind for e in allocator.take_kv_events()] == ["stored"]


def test_prefix_counters_accumulate_tokens():
    allocator = BlockAllocator(4, 2, True)
    allocator.record_prefix_query(10, 4)
    allocator.record_prefix_query(6, 0)
    assert (allocator.prefix_cache_queries, allocator.prefix_cache_hits) == (16, 4)


def test_cached_block_hashes_lists_free_cached_blocks_oldest_first_then_blocks_in_use():
    allocator = BlockAllocator(4, 2, True)
    old, new = hash_prompt_blocks([1, 2, 3, 4], 2), hash_prompt_blocks([9, 9], 2)
    a = allocator.allocate(2)
    allocator.cache_blocks(a, old)
    allocator.free(a)  # freed in reverse: the tail block is the older free entry
    b = allocator.allocate(1)  # takes a never-cached block, evicting nothing cached
    allocator.cache_blocks(b, new)
    assert allocator.cached_block_hashes() == [old[1], old[0], new[0]]
    allocator.allocate(2)  # takes the two oldest free blocks: the uncached one and old[1]'s
    assert allocator.cached_block_hashes() == [old[0], new[0]]
