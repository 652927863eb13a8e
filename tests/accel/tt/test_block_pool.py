"""BlockPool: allocation, ref counts, prefix hits, LRU eviction, KV events."""

from __future__ import annotations

import pytest

from accel.block_hash import hash_prompt_blocks
from accel.contract import PrefixCacheChange
from accel.tt.block_pool import BlockPool


def test_allocate_and_free_return_every_block():
    pool = BlockPool(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a = pool.allocate(3)
    b = pool.allocate(5)
    assert sorted(a + b) == list(range(8)) and pool.num_free_blocks == 0
    with pytest.raises(RuntimeError):
        pool.allocate(1)
    pool.free(a)
    pool.free(b)
    assert pool.num_free_blocks == 8
    assert all(pool.ref_count(i) == 0 for i in range(8))


def test_double_free_is_caught():
    pool = BlockPool(4, 4, False)
    blocks = pool.allocate(1)
    pool.free(blocks)
    with pytest.raises(AssertionError):
        pool.free(blocks)


def test_cached_prefix_is_found_and_shared():
    pool = BlockPool(8, 4, True, lane=2)
    tokens = list(range(10, 22))  # 3 full blocks
    hashes = hash_prompt_blocks(tokens, 4)
    blocks = pool.allocate(3)
    pool.cache_blocks(blocks, hashes)
    assert pool.take_kv_events() == [PrefixCacheChange("stored", 2, tuple(hashes))]
    # Still referenced: a second request sharing 2 blocks of prefix finds them.
    other = hash_prompt_blocks(tokens[:8] + [99, 98, 97, 96], 4)
    hit = pool.find_cached_prefix(other)
    assert hit == blocks[:2]
    pool.touch(hit)
    assert pool.ref_count(blocks[0]) == 2
    pool.free(blocks)
    pool.free(hit)
    assert pool.num_free_blocks == 8
    # Free but cached: still found, and touching takes them out of the free queue.
    hit = pool.find_cached_prefix(hashes)
    assert hit == blocks
    assert pool.num_free_after_touch(hit) == 5
    pool.touch(hit)
    assert pool.num_free_blocks == 5


def test_prefix_caching_off_finds_nothing_and_emits_nothing():
    pool = BlockPool(4, 4, False)
    hashes = hash_prompt_blocks(list(range(8)), 4)
    blocks = pool.allocate(2)
    pool.cache_blocks(blocks, hashes)
    assert pool.find_cached_prefix(hashes) == []
    assert pool.take_kv_events() == []


def test_lru_eviction_takes_oldest_free_block_and_reports_removal():
    pool = BlockPool(3, 2, True)
    blocks = pool.allocate(3)
    hashes = hash_prompt_blocks([1, 2, 3, 4, 5, 6], 2)
    pool.cache_blocks(blocks, hashes)
    pool.take_kv_events()
    pool.free([blocks[1]])  # freed first: least recently used
    pool.free([blocks[0]])
    pool.free([blocks[2]])
    (fresh,) = pool.allocate(1)
    assert fresh == blocks[1]
    assert pool.take_kv_events() == [PrefixCacheChange("removed", 0, (hashes[1],))]
    assert pool.find_cached_prefix(hashes) == [blocks[0]]  # chain broken at block 1


def test_free_releases_tail_blocks_first():
    pool = BlockPool(4, 2, True)
    blocks = pool.allocate(4)
    pool.cache_blocks(blocks, hash_prompt_blocks(list(range(8)), 2))
    pool.free(blocks)
    # Reverse order: the last block of the sequence is evicted first, the prefix survives longest.
    assert pool.allocate(1) == [blocks[3]]


def test_duplicate_hash_is_not_cached_twice():
    pool = BlockPool(4, 2, True)
    h = hash_prompt_blocks([5, 6], 2)
    a, b = pool.allocate(2)
    pool.cache_blocks([a], h)
    pool.cache_blocks([b], h)
    assert pool.find_cached_prefix(h) == [a]
    assert [e.kind for e in pool.take_kv_events()] == ["stored"]


def test_prefix_counters_accumulate_tokens():
    pool = BlockPool(4, 2, True)
    pool.record_prefix_query(10, 4)
    pool.record_prefix_query(6, 0)
    assert (pool.prefix_cache_queries, pool.prefix_cache_hits) == (16, 4)


def test_cached_block_hashes_lists_free_cached_blocks_oldest_first_then_blocks_in_use():
    pool = BlockPool(4, 2, True)
    old, new = hash_prompt_blocks([1, 2, 3, 4], 2), hash_prompt_blocks([9, 9], 2)
    a = pool.allocate(2)
    pool.cache_blocks(a, old)
    pool.free(a)  # freed in reverse: the tail block is the older free entry
    b = pool.allocate(1)  # takes a never-cached block, evicting nothing cached
    pool.cache_blocks(b, new)
    assert pool.cached_block_hashes() == [old[1], old[0], new[0]]
    pool.allocate(2)  # takes the two oldest free blocks: the uncached one and old[1]'s
    assert pool.cached_block_hashes() == [old[0], new[0]]
