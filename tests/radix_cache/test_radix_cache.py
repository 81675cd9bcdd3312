"""RadixCache unit cases (SGLang's test_radix_cache_unit adapted) plus LRU/lock/split details.

Every test asserts exact page ids and token counts.
"""

from collections.abc import Iterable

import pytest

from radixlm.radix_cache import MatchResult, PagePool, RadixCache, RadixCacheInvariantError


class RecordingPool(PagePool):
    """PagePool that remembers each free() call's pages, in order."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        super().__init__(num_pages, page_size)
        self.freed: list[list[int]] = []

    def free(self, pages: Iterable[int]) -> None:
        pages = list(pages)
        super().free(pages)
        self.freed.append(pages)


def make(page_size: int = 1, num_pages: int = 64, disable: bool = False):
    pool = RecordingPool(num_pages, page_size)
    return pool, RadixCache(pool, page_size, disable=disable)


def put(cache: RadixCache, pool: PagePool, key: list[int]) -> list[int]:
    """Insert ``key`` the way the KV manager does; return the tree's pages for it.

    Match first, allocate pages only for the uncached tail, insert prefix + new pages, free any
    of the caller's pages the tree did not take.
    """
    cached = cache.match_prefix(key).page_indices
    new = pool.alloc(len(key) // cache.page_size - len(cached))
    assert new is not None
    pages = cached + new
    existing = cache.insert(key, pages)
    tree_pages = cache.match_prefix(key).page_indices
    pool.free([p for p, t in zip(pages[: existing // cache.page_size], tree_pages) if p != t])
    cache.check_invariants()
    return tree_pages


def sizes(cache: RadixCache) -> tuple[int, int, int]:
    return cache.total_size(), cache.evictable_size(), cache.protected_size()


# ------------------------------------------------------------------------ SGLang unit cases


def test_first_insert_returns_zero() -> None:
    pool, cache = make()
    pages = pool.alloc(3)
    assert pages == [1, 2, 3]
    assert cache.insert([1, 2, 3], pages) == 0
    assert sizes(cache) == (3, 3, 0)
    assert cache.all_pages() == [1, 2, 3]
    cache.check_invariants()


def test_exact_and_partial_matches() -> None:
    pool, cache = make()
    assert put(cache, pool, [1, 2, 3]) == [1, 2, 3]
    exact = cache.match_prefix([1, 2, 3])
    assert (exact.page_indices, exact.num_tokens) == ([1, 2, 3], 3)
    longer = cache.match_prefix([1, 2, 3, 4, 5])
    assert (longer.page_indices, longer.num_tokens) == ([1, 2, 3], 3)
    assert longer.last_node is exact.last_node
    partial = cache.match_prefix([1, 2])
    assert (partial.page_indices, partial.num_tokens) == ([1, 2], 2)
    assert partial.last_node.key == (1, 2)  # split so last_node is exact
    miss = cache.match_prefix([9, 1, 2])
    assert (miss.page_indices, miss.num_tokens, miss.last_node) == ([], 0, cache.root)
    empty = cache.match_prefix([])
    assert (empty.page_indices, empty.num_tokens) == ([], 0)
    assert sizes(cache) == (3, 3, 0)
    cache.check_invariants()


def test_insert_returns_existing_length_and_takes_only_the_tail() -> None:
    pool, cache = make()
    put(cache, pool, [1, 2, 3])  # pages 1, 2, 3
    pages = pool.alloc(5)
    assert pages == [4, 5, 6, 7, 8]
    assert cache.insert([1, 2, 3, 4, 5], pages) == 3
    assert cache.match_prefix([1, 2, 3, 4, 5]).page_indices == [1, 2, 3, 7, 8]
    pool.free(pages[:3])  # the caller frees its duplicates
    assert sizes(cache) == (5, 5, 0)
    assert pool.available_pages == 64 - 5
    # Fully cached key: nothing taken.
    assert cache.insert([1, 2, 3, 4], [9, 9, 9, 9]) == 4
    assert sizes(cache) == (5, 5, 0)
    cache.check_invariants()


def test_disabled_cache_matches_nothing_and_stays_empty() -> None:
    pool, cache = make(disable=True)
    pages = pool.alloc(3)
    assert pages is not None
    assert cache.insert([1, 2, 3], pages) == 3  # caller frees everything uniformly
    pool.free(pages)
    result = cache.match_prefix([1, 2, 3])
    assert result == MatchResult([], 0, cache.root)
    assert sizes(cache) == (0, 0, 0)
    cache.lock(result.last_node)
    cache.unlock(result.last_node)
    assert cache.evict(10) == 0
    assert cache.all_pages() == []
    assert pool.available_pages == 64
    cache.check_invariants()


def test_lock_unlock_moves_exactly_three_tokens() -> None:
    pool, cache = make()
    put(cache, pool, [1, 2, 3])
    node = cache.match_prefix([1, 2, 3]).last_node
    cache.lock(node)
    assert sizes(cache) == (3, 0, 3)
    cache.check_invariants()
    cache.unlock(node)
    assert sizes(cache) == (3, 3, 0)
    cache.check_invariants()
    with pytest.raises(ValueError, match="not locked"):
        cache.unlock(node)
    assert sizes(cache) == (3, 3, 0)


def test_lock_is_a_ref_count_up_the_path() -> None:
    pool, cache = make()
    put(cache, pool, [1, 2, 3, 4, 5])
    upper = cache.match_prefix([1, 2, 3]).last_node  # splits [1..5] into [1,2,3] + [4,5]
    lower = cache.match_prefix([1, 2, 3, 4, 5]).last_node
    cache.lock(lower)
    assert sizes(cache) == (5, 0, 5)
    cache.lock(upper)
    assert (upper.lock_ref, lower.lock_ref) == (2, 1)
    cache.unlock(lower)
    assert sizes(cache) == (5, 2, 3)
    cache.check_invariants()
    cache.unlock(upper)
    assert sizes(cache) == (5, 5, 0)
    cache.lock(cache.root)  # the root is a no-op
    cache.unlock(cache.root)
    cache.check_invariants()


def test_split_of_a_locked_node_inherits_the_lock() -> None:
    pool, cache = make()
    put(cache, pool, [1, 2, 3, 4])
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.lock(node)
    upper = cache.match_prefix([1, 2, 7]).last_node
    assert upper.key == (1, 2) and upper.lock_ref == 1 and node.key == (3, 4)
    assert sizes(cache) == (4, 0, 4)
    cache.check_invariants()
    cache.unlock(node)  # walks through the new upper node
    assert (upper.lock_ref, node.lock_ref) == (0, 0)
    assert sizes(cache) == (4, 4, 0)
    cache.check_invariants()


def test_evict_frees_pages_to_the_pool_and_shrinks_the_tree() -> None:
    pool, cache = make()
    put(cache, pool, [1, 2, 3])
    assert put(cache, pool, [1, 2, 4, 5]) == [1, 2, 4, 5]
    pool.freed.clear()
    assert sizes(cache) == (5, 5, 0)
    assert pool.available_pages == 64 - 5
    assert cache.evict(100) == 5
    assert sizes(cache) == (0, 0, 0)
    assert pool.available_pages == 64
    assert pool.freed == [[3], [4, 5], [1, 2]]  # leaves oldest first, then the parent
    assert cache.match_prefix([1, 2, 3]).num_tokens == 0
    assert cache.root.children == {}
    assert cache.evict(1) == 0
    cache.check_invariants()


@pytest.mark.parametrize("page_size", [1, 2, 4])
def test_matches_are_page_aligned(page_size: int) -> None:
    pool, cache = make(page_size)
    key = [1, 2, 3, 4, 5, 6, 7, 8]
    pages = put(cache, pool, key)
    assert pages == list(range(1, 8 // page_size + 1))
    # Mismatch inside a page (token index 5) of a single unsplit node: the page is dropped.
    result = cache.match_prefix([1, 2, 3, 4, 5, 99, 7, 8])
    expected = {1: 5, 2: 4, 4: 4}[page_size]
    assert result.num_tokens == expected
    assert result.page_indices == pages[: expected // page_size]
    assert result.last_node.key[-1] == expected
    for length in range(len(key) + 1):
        result = cache.match_prefix(key[:length])
        aligned = length - length % page_size
        assert result.num_tokens == aligned
        assert result.page_indices == pages[: aligned // page_size]
    assert sizes(cache) == (8, 8, 0)
    cache.check_invariants()


@pytest.mark.parametrize("page_size", [2, 4])
def test_insert_rejects_unaligned_keys_and_page_count_mismatch(page_size: int) -> None:
    pool, cache = make(page_size)
    with pytest.raises(ValueError):
        cache.insert([1, 2, 3], [1, 2])
    with pytest.raises(ValueError):
        cache.insert([1] * page_size * 2, [1])
    assert sizes(cache) == (0, 0, 0)


@pytest.mark.parametrize("page_size", [1, 2])
def test_split_scenario(page_size: int) -> None:
    pool, cache = make(page_size)
    long_pages = put(cache, pool, [1, 2, 3, 4, 5, 6, 7, 8])
    short_pages = put(cache, pool, [1, 2, 9, 10])
    assert cache.total_size() == 10
    # [1, 2] is shared (page size 1: one page per token; page size 2: the first page).
    assert short_pages[: 2 // page_size] == long_pages[: 2 // page_size]

    at4 = cache.match_prefix([1, 2, 3, 4, 999, 1000])
    assert at4.num_tokens == 4
    assert at4.page_indices == long_pages[: 4 // page_size]
    assert at4.last_node.key[-2:] == (3, 4)
    assert cache.total_size() == 10

    at6 = cache.match_prefix([1, 2, 3, 4, 5, 6, 999, 1000])
    assert at6.num_tokens == 6
    assert at6.page_indices == long_pages[: 6 // page_size]
    assert cache.total_size() == 10

    full_long = cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8])
    full_short = cache.match_prefix([1, 2, 9, 10])
    assert (full_long.page_indices, full_long.num_tokens) == (long_pages, 8)
    assert (full_short.page_indices, full_short.num_tokens) == (short_pages, 4)
    assert sizes(cache) == (10, 10, 0)
    assert pool.available_pages == 64 - 10 // page_size
    cache.check_invariants()


# ----------------------------------------------------------------------------- LRU eviction


def _three_leaves() -> tuple[RecordingPool, RadixCache]:
    """Tree: [1,2] -> {[3] page 3, [4] page 4}, [5,6] pages 5,6; pages 1,2 on [1,2]."""
    pool, cache = make()
    assert put(cache, pool, [1, 2, 3]) == [1, 2, 3]
    assert put(cache, pool, [1, 2, 4]) == [1, 2, 4]
    assert put(cache, pool, [5, 6]) == [5, 6]
    pool.freed.clear()
    return pool, cache


def test_evict_is_lru_over_leaves_one_leaf_at_a_time() -> None:
    pool, cache = _three_leaves()
    for key in ([5, 6], [1, 2, 3], [1, 2, 4]):  # oldest to newest
        cache.match_prefix(key)
    assert cache.evict(1) == 2  # whole leaf [5, 6]
    assert pool.freed == [[5, 6]]
    assert cache.evict(1) == 1
    assert pool.freed[-1] == [3]
    assert cache.evict(1) == 1  # stops once 1 token is freed: [1, 2] is now a leaf but stays
    assert pool.freed[-1] == [4]
    assert sizes(cache) == (2, 2, 0)
    cache.check_invariants()
    assert cache.evict(1) == 2
    assert pool.freed[-1] == [1, 2]
    assert sizes(cache) == (0, 0, 0)
    assert pool.available_pages == 64
    cache.check_invariants()


def test_evict_cascades_to_a_parent_that_becomes_the_lru_leaf() -> None:
    pool, cache = _three_leaves()
    for key in ([1, 2, 3], [1, 2, 4], [5, 6]):
        cache.match_prefix(key)
    # Leaves by age: [3], [4], [5, 6]; after both children go, [1, 2] (touched with [4]) is
    # older than [5, 6] and is evicted next.
    assert cache.evict(4) == 4
    assert pool.freed == [[3], [4], [1, 2]]
    assert cache.match_prefix([5, 6]).page_indices == [5, 6]
    assert sizes(cache) == (2, 2, 0)
    cache.check_invariants()


def test_match_refreshes_only_the_matched_part_of_a_split_node() -> None:
    pool, cache = make()
    put(cache, pool, [1, 2, 3, 4])  # pages 1..4
    put(cache, pool, [9])  # page 5
    pool.freed.clear()
    cache.match_prefix([1, 2])  # [1, 2] becomes newest; the unmatched [3, 4] keeps its old time
    assert cache.evict(1) == 2
    assert pool.freed == [[3, 4]]
    assert cache.evict(1) == 1
    assert pool.freed[-1] == [5]
    cache.check_invariants()


def test_locked_leaves_are_never_evicted() -> None:
    pool, cache = _three_leaves()
    node = cache.match_prefix([1, 2, 4]).last_node
    cache.lock(node)
    assert sizes(cache) == (6, 3, 3)
    assert cache.evict(100) == 3
    assert sorted(pool.freed) == [[3], [5, 6]]
    assert cache.match_prefix([1, 2, 4]).page_indices == [1, 2, 4]
    assert sizes(cache) == (3, 0, 3)
    cache.check_invariants()
    cache.unlock(node)
    assert sizes(cache) == (3, 3, 0)
    assert cache.evict(100) == 3
    assert pool.available_pages == 64
    with pytest.raises(ValueError, match="detached"):
        cache.lock(node)
    cache.check_invariants()


# ---------------------------------------------------------------------- reset and invariants


def test_reset_frees_every_page_and_refuses_while_locked() -> None:
    pool, cache = _three_leaves()
    node = cache.match_prefix([5, 6]).last_node
    cache.lock(node)
    with pytest.raises(RuntimeError):
        cache.reset()
    cache.unlock(node)
    cache.reset()
    assert sizes(cache) == (0, 0, 0)
    assert pool.available_pages == 64
    assert cache.all_pages() == []
    assert cache.match_prefix([1, 2, 3]).num_tokens == 0
    cache.check_invariants()


def test_all_pages_and_pretty_print() -> None:
    pool, cache = _three_leaves()
    assert sorted(cache.all_pages()) == [1, 2, 3, 4, 5, 6]
    text = cache.pretty_print()
    assert "[1, 2] pages=[1, 2]" in text
    assert "[3] pages=[3]" in text and "[5, 6] pages=[5, 6]" in text


def test_check_invariants_detects_corruption() -> None:
    pool, cache = _three_leaves()
    assert issubclass(RadixCacheInvariantError, AssertionError)

    pool.free([4])  # a tree page handed back behind the tree's back
    with pytest.raises(RadixCacheInvariantError, match="free in the pool"):
        cache.check_invariants()
    assert pool.alloc(1) == [4]
    cache.check_invariants()

    cache._evictable += 1  # counter drift
    with pytest.raises(RadixCacheInvariantError, match="evictable/protected"):
        cache.check_invariants()
    cache._evictable -= 1

    leaf = cache.match_prefix([5, 6]).last_node
    leaf.value.append(3)  # key/value length mismatch and a duplicate page
    with pytest.raises(RadixCacheInvariantError):
        cache.check_invariants()
    leaf.value.pop()

    parent = cache.match_prefix([1, 2]).last_node
    child = cache.match_prefix([1, 2, 3]).last_node
    child.lock_ref = 1  # child locked but parent not
    with pytest.raises(RadixCacheInvariantError, match="lock_ref"):
        cache.check_invariants()
    child.lock_ref = 0
    assert parent.lock_ref == 0
    cache.check_invariants()


def test_pool_page_size_must_match() -> None:
    with pytest.raises(ValueError):
        RadixCache(PagePool(4, 2), page_size=4)
