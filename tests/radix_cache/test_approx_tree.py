"""The cache-aware router's approximate tree: per-tenant longest matches and sizes against a
brute-force reference, LRU pruning order and the size bound."""

from __future__ import annotations

import random

import pytest

from radixlm.radix_cache.approx_tree import ApproxPrefixTree


def _common(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _check_invariants(tree: ApproxPrefixTree) -> None:
    """A tenant at a node is at its parent; each tenant's size is the sum of its nodes' key lengths."""
    sizes: dict[int, int] = {}
    stack = list(tree.root.children.values())
    while stack:
        node = stack.pop()
        assert node.key and node.tenants, "empty keys and tenantless nodes must not survive"
        assert node.parent.children[node.key[0]] is node
        if node.parent is not tree.root:
            assert set(node.tenants) <= set(node.parent.tenants)
        for t in node.tenants:
            sizes[t] = sizes.get(t, 0) + len(node.key)
        stack.extend(node.children.values())
    for t, n in sizes.items():
        assert tree.size(t) == n, (t, tree.size(t), n)


def test_match_gives_each_tenant_its_longest_prefix():
    tree = ApproxPrefixTree()
    tree.insert([1, 2, 3, 4, 5], 0)
    tree.insert([1, 2, 3, 9], 1)
    tree.insert([7, 8], 1)
    assert tree.match([1, 2, 3, 4, 5, 6]) == {0: 5, 1: 3}
    assert tree.match([1, 2, 3, 9, 9]) == {0: 3, 1: 4}
    assert tree.match([1, 2]) == {0: 2, 1: 2}
    assert tree.match([7, 8, 1]) == {1: 2}
    assert tree.match([5]) == {}
    # shared prefixes count once per tenant: 0 holds 1..5, 1 holds 1,2,3 + 9 + 7,8
    assert (tree.size(0), tree.size(1)) == (5, 6)
    _check_invariants(tree)


def test_against_brute_force_reference():
    rng = random.Random(7)
    tree = ApproxPrefixTree()
    keys: dict[int, list[list[int]]] = {0: [], 1: [], 2: []}
    for _ in range(400):
        base = rng.choice([[], [1, 2, 3, 4], [1, 2, 5], [6] * 5])
        key = base + [rng.randrange(4) for _ in range(rng.randrange(1, 6))]
        tenant = rng.randrange(3)
        tree.insert(key, tenant)
        keys[tenant].append(key)
        query = rng.choice([[], [1, 2, 3, 4], [1, 2, 5], [6] * 5]) + [rng.randrange(4) for _ in range(4)]
        expected = {t: max(_common(k, query) for k in ks) for t, ks in keys.items() if ks}
        assert tree.match(query) == {t: n for t, n in expected.items() if n > 0}
        for t, ks in keys.items():
            assert tree.size(t) == len({tuple(k[:i]) for k in ks for i in range(1, len(k) + 1)})
    _check_invariants(tree)


def test_prune_drops_least_recently_routed_leaves_first():
    tree = ApproxPrefixTree()
    tree.insert([1, 2, 3], 0)  # oldest
    tree.insert([4, 5, 6], 0)
    tree.insert([1, 2, 3], 0)  # refreshed: now newer than [4, 5, 6]
    tree.insert([7, 8, 9], 1)
    tree.prune(0, 3)
    assert tree.match([1, 2, 3]) == {0: 3}
    assert tree.match([4, 5, 6]) == {}
    assert tree.match([7, 8, 9]) == {1: 3}  # other tenants untouched
    _check_invariants(tree)


def test_prune_removes_an_extension_before_its_prefix():
    tree = ApproxPrefixTree()
    tree.insert([1, 2, 3, 4], 0)
    tree.insert([1, 2, 9, 9], 0)
    tree.insert([1, 2, 3, 4], 0)  # [1, 2] is shared; [9, 9] is the oldest leaf
    tree.prune(0, 4)
    assert tree.match([1, 2, 9, 9]) == {0: 2}
    assert tree.match([1, 2, 3, 4]) == {0: 4}
    tree.prune(0, 1)  # [3, 4] goes, then [1, 2], which has become a leaf
    assert tree.size(0) == 0 and tree.num_nodes() == 0


def test_insert_keeps_every_tenant_within_max_size():
    rng = random.Random(3)
    tree = ApproxPrefixTree(max_size=200)
    for i in range(500):
        tenant = rng.randrange(2)
        tree.insert([rng.randrange(3)] + [rng.randrange(50) for _ in range(rng.randrange(1, 40))], tenant)
        assert tree.size(0) <= 200 and tree.size(1) <= 200
    _check_invariants(tree)
    # the most recent insert always survives its own prune
    tree.insert(list(range(100, 150)), 1)
    assert tree.match(list(range(100, 150))) == {1: 50}


def test_remove_tenant_forgets_only_that_tenant():
    tree = ApproxPrefixTree()
    tree.insert([1, 2, 3], 0)
    tree.insert([1, 2, 3], 1)
    tree.remove_tenant(0)
    assert tree.match([1, 2, 3]) == {1: 3} and tree.size(0) == 0
    _check_invariants(tree)


def test_bad_arguments():
    with pytest.raises(ValueError):
        ApproxPrefixTree(max_size=0)
    with pytest.raises(ValueError):
        ApproxPrefixTree(prune_to=0)
