"""RadixCache.continuation: what the tree holds after a whole context (n-gram speculative drafts)."""

from radixlm.radix_cache import PagePool, RadixCache


def _tree(page_size: int, *seqs: list[int]) -> RadixCache:
    pool = PagePool(64, page_size)
    tree = RadixCache(pool, page_size)
    for s in seqs:
        n = len(s) - len(s) % page_size
        tree.insert(s[:n], pool.alloc(n // page_size))
    return tree


def _shape(tree: RadixCache) -> list[tuple]:
    return sorted((n.id, n.key, tuple(n.value), n.last_access) for n in tree._iter_nodes())


def test_continues_after_a_whole_node_and_inside_one():
    tree = _tree(1, [1, 2, 3, 4, 5, 6])
    assert tree.continuation([1, 2, 3], 10) == [4, 5, 6]  # the context ends inside the node
    assert tree.continuation([1, 2, 3], 2) == [4, 5]
    assert tree.continuation([1, 2, 3, 4, 5, 6], 4) == []  # nothing after the whole sequence
    assert tree.continuation([1, 2, 9], 4) == []  # the context differs
    assert tree.continuation([7], 4) == []
    assert tree.continuation([], 3) == [1, 2, 3]
    assert tree.continuation([1, 2], 0) == []


def test_follows_the_most_recently_used_branch_across_nodes():
    tree = _tree(1, [1, 2, 3, 4, 5], [1, 2, 3, 7, 8, 9, 10])
    assert tree.continuation([1, 2], 10) == [3, 7, 8, 9, 10]  # the later insert is fresher
    tree.match_prefix([1, 2, 3, 4, 5])  # now the first branch is the fresher one
    assert tree.continuation([1, 2], 10) == [3, 4, 5]
    assert tree.continuation([1, 2, 3, 7], 2) == [8, 9]


def test_is_read_only():
    tree = _tree(1, [1, 2, 3, 4, 5, 6], [1, 2, 8])
    before = _shape(tree)
    assert tree.continuation([1, 2, 3, 4], 5) == [5, 6]
    assert _shape(tree) == before  # no split, no access-time refresh
    tree.check_invariants()


def test_pages_and_an_unaligned_context():
    tree = _tree(4, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1, 2, 3, 4, 20, 21, 22, 23])
    assert tree.continuation([1, 2, 3, 4, 5, 6], 3) == [7, 8, 9]  # ends inside a page
    assert tree.continuation([1, 2, 3, 4, 20], 8) == [21, 22, 23]
    assert tree.continuation([1, 2, 3, 4, 5, 6, 7, 8], 8) == [9, 10, 11, 12]
    assert tree.continuation([1, 2, 3, 4, 5, 7], 3) == []


def test_disabled_cache_has_nothing():
    pool = PagePool(8, 1)
    assert RadixCache(pool, 1, disable=True).continuation([1, 2], 4) == []
