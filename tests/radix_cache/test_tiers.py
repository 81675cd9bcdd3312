"""Tier bookkeeping below the radix tree: chain digests, the host index's LRU, and the tree's listener."""

from __future__ import annotations

import random

import pytest

from radixlm.radix_cache import HostTierIndex, PagePool, RadixCache, page_digests


def test_digest_names_the_whole_prefix():
    a = page_digests([1, 2, 3, 4, 5, 6, 7], page_size=2)
    assert len(a) == 3 and len(set(a)) == 3  # the partial last page has no digest
    # Same page tokens after a different prefix: a different digest (a digest names the prefix).
    b = page_digests([9, 9, 3, 4], page_size=2)
    assert b[1] != a[1]
    # Same prefix: same digests, whatever follows.
    assert page_digests([1, 2, 3, 4, 8, 8], page_size=2)[:2] == a[:2]
    # Deterministic across calls (process-independent: no hash()).
    assert page_digests([1, 2, 3, 4, 5, 6], 2) == a


def test_digest_continuation_equals_full_chain():
    tokens = [random.Random(0).randrange(50_000) for _ in range(64)]
    full = page_digests(tokens, 4)
    assert page_digests(tokens, 4, start=16, prev=full[3]) == full[4:]
    with pytest.raises(ValueError):
        page_digests(tokens, 4, start=16)
    with pytest.raises(ValueError):
        page_digests(tokens, 4, start=3, prev=full[0])


def test_digest_distinguishes_large_token_ids():
    # ids above 2**31 (no truncation to 32 bits)
    assert page_digests([2**31 + 5], 1) != page_digests([5], 1)


def test_host_index_lru_evicts_deepest_first():
    idx = HostTierIndex(PagePool(3, 1))
    d = page_digests([10, 11, 12, 13, 14], 1)
    pages = [idx.add(x) for x in d[:3]]
    assert sorted(pages) == [1, 2, 3]
    idx.touch(d[:3])  # a lookup of the whole chain: the root page becomes the most recent
    idx.add(d[3])  # full: the deepest (least recent after the reverse touch) goes
    assert d[2] not in idx and d[0] in idx and d[1] in idx and d[3] in idx
    assert idx.num_evicted == 1
    idx.check_invariants()


def test_host_index_add_existing_refreshes_and_returns_same_page():
    idx = HostTierIndex(PagePool(2, 1))
    d = page_digests([1, 2, 3], 1)
    p0 = idx.add(d[0])
    idx.add(d[1])
    assert idx.add(d[0]) == p0  # refreshed, not duplicated
    idx.add(d[2])  # evicts d[1], the least recent now
    assert d[1] not in idx and idx.lookup(d[0]) == p0
    idx.check_invariants()


def test_host_index_zero_capacity_and_clear():
    assert HostTierIndex(PagePool(0, 1)).add(b"x" * 16) is None
    idx = HostTierIndex(PagePool(4, 2))
    for x in page_digests(list(range(8)), 2):
        idx.add(x)
    assert idx.used_pages() == 4
    idx.clear()
    assert idx.used_pages() == 0 and idx.pool.available_pages == 4
    idx.check_invariants()


def test_host_index_invariants_catch_a_leak():
    idx = HostTierIndex(PagePool(4, 1))
    idx.add(b"a" * 16)
    idx.pool.alloc(1)  # a page taken behind the index's back
    with pytest.raises(AssertionError, match="host pool leak"):
        idx.check_invariants()


class Recorder:
    def __init__(self) -> None:
        self.inserted: list[tuple[tuple[int, ...], int, list[int]]] = []
        self.evicted: list[tuple[tuple[int, ...], list[int]]] = []
        self.pool: PagePool | None = None

    def on_insert(self, key, start, pages):
        self.inserted.append((tuple(key), start, list(pages)))

    def on_evict(self, key, pages):
        assert self.pool is not None and not any(self.pool.is_free(p) for p in pages), "evicted pages still held"
        self.evicted.append((tuple(key), list(pages)))


def test_tree_tells_listener_of_inserted_tails_and_evicted_leaves():
    pool = PagePool(16, 2)
    rec = Recorder()
    rec.pool = pool
    tree = RadixCache(pool, 2, listener=rec)
    p1 = pool.alloc(3)
    assert tree.insert([1, 2, 3, 4, 5, 6], p1) == 0
    p2 = pool.alloc(3)
    existing = tree.insert([1, 2, 3, 4, 7, 8], p2)
    assert existing == 4
    pool.free(p2[:2])
    assert rec.inserted == [((1, 2, 3, 4, 5, 6), 0, p1), ((1, 2, 3, 4, 7, 8), 4, [p2[2]])]
    # Re-inserting what is cached tells nothing.
    tree.insert([1, 2, 3, 4], p1[:2])
    assert len(rec.inserted) == 2
    # Evict everything: leaves first with their full prefix from the root, then the parent.
    tree.evict(100)
    keys = [k for k, _ in rec.evicted]
    assert set(keys[:2]) == {(1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 7, 8)}
    assert rec.evicted[2] == ((1, 2, 3, 4), p1[:2])
    assert {tuple(p) for _, p in rec.evicted[:2]} == {(p1[2],), (p2[2],)}
    # reset is a flush, not an eviction: nothing reported.
    tree.insert([5, 5], pool.alloc(1))
    tree.reset()
    assert len(rec.evicted) == 3


def test_full_key_after_split():
    pool = PagePool(8, 1)
    tree = RadixCache(pool, 1)
    tree.insert([1, 2, 3, 4], pool.alloc(4))
    m = tree.match_prefix([1, 2])  # splits the node
    assert tree.full_key(m.last_node) == (1, 2)
    leaf = next(iter(m.last_node.children.values()))
    assert tree.full_key(leaf) == (1, 2, 3, 4)
