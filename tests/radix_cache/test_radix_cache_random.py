"""Randomised differential test of RadixCache against a naive flat-list reference.

The reference stores one entry per cached page: the token prefix ending at that page, the page
id, a last-access time, a lock count and a ``node_end`` flag. It answers every question by scanning
the list, never by walking a tree. It models the tree's observable behaviour independently:

* match/insert: the matched pages are the entries whose prefixes are successive page prefixes of
  the key; matched pages (and new ones) get the operation's time;
* locks: locking a matched prefix adds 1 to every entry that is a prefix of it;
* node boundaries: a tree node ends wherever an insert ended, a match/insert stopped (the tree
  splits there), or an insert branched; boundaries vanish with their page;
* eviction: repeatedly take the unlocked leaf page with the oldest time (unique: two leaves
  touched by the same operation would lie on one path), and evict pages upwards until a node
  boundary, i.e. one whole tree node per step, stopping once enough tokens are freed.

After every operation the test compares match results, freed page batches (order and node
granularity), sizes and page sets, and runs ``check_invariants``.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

import pytest

from radixlm.radix_cache import PagePool, RadixCache, TreeNode


class RecordingPool(PagePool):
    """PagePool that remembers each free() call's pages, in order."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        super().__init__(num_pages, page_size)
        self.freed: list[list[int]] = []

    def free(self, pages: Iterable[int]) -> None:
        pages = list(pages)
        super().free(pages)
        self.freed.append(pages)


@dataclass(eq=False)
class Entry:
    prefix: tuple[int, ...]  # tokens from the root up to and including this page
    page: int
    time: int
    locks: int = 0
    node_end: bool = False  # a tree node ends after this page


class NaiveReference:
    def __init__(self, page_size: int) -> None:
        self.ps = page_size
        self.entries: list[Entry] = []
        self.clock = 0

    def _find(self, prefix: tuple[int, ...]) -> Entry | None:
        for e in self.entries:
            if e.prefix == prefix:
                return e
        return None

    def _has_child(self, entry: Entry) -> bool:
        n = len(entry.prefix)
        return any(
            len(e.prefix) == n + self.ps and e.prefix[:n] == entry.prefix for e in self.entries
        )

    def _path(self, key: tuple[int, ...]) -> list[Entry]:
        path: list[Entry] = []
        for end in range(self.ps, len(key) + 1, self.ps):
            e = self._find(key[:end])
            if e is None:
                break
            path.append(e)
        return path

    def match(self, key: tuple[int, ...]) -> tuple[list[int], int, tuple[int, ...]]:
        self.clock += 1
        path = self._path(key)
        for e in path:
            e.time = self.clock
        if path:
            path[-1].node_end = True
        num_tokens = len(path) * self.ps
        return [e.page for e in path], num_tokens, key[:num_tokens]

    def insert(self, key: tuple[int, ...], pages: list[int]) -> int:
        self.clock += 1
        path = self._path(key)
        for e in path:
            e.time = self.clock
        if path:
            path[-1].node_end = True
        for k in range(len(path), len(pages)):
            self.entries.append(Entry(key[: (k + 1) * self.ps], pages[k], self.clock))
        if len(pages) > len(path):
            self.entries[-1].node_end = True
        return len(path) * self.ps

    def add_lock(self, prefix: tuple[int, ...], delta: int) -> None:
        for e in self.entries:
            if len(e.prefix) <= len(prefix) and prefix[: len(e.prefix)] == e.prefix:
                e.locks += delta
                assert e.locks >= 0

    def evictable(self) -> int:
        return self.ps * sum(1 for e in self.entries if e.locks == 0)

    def protected(self) -> int:
        return self.ps * sum(1 for e in self.entries if e.locks > 0)

    def evict(self, num_tokens: int) -> list[list[int]]:
        batches: list[list[int]] = []
        evicted = 0
        while evicted < num_tokens:
            leaves = [e for e in self.entries if e.locks == 0 and not self._has_child(e)]
            if not leaves:
                break
            oldest = min(e.time for e in leaves)
            candidates = [e for e in leaves if e.time == oldest]
            assert len(candidates) == 1, "model assumption: the LRU leaf is unique"
            entry = candidates[0]
            batch: list[int] = []
            while True:  # one whole tree node, bottom-up
                self.entries.remove(entry)
                batch.append(entry.page)
                evicted += self.ps
                parent = self._find(entry.prefix[: -self.ps]) if len(entry.prefix) > self.ps else None
                if parent is None or parent.node_end:
                    break
                assert not self._has_child(parent) and parent.locks == 0
                assert parent.time == entry.time
                entry = parent
            batch.reverse()
            batches.append(batch)
        return batches


def _full_key(node: TreeNode) -> tuple[int, ...]:
    parts: list[tuple[int, ...]] = []
    while node.parent is not None:
        parts.append(node.key)
        node = node.parent
    return tuple(t for part in reversed(parts) for t in part)


class Driver:
    """Applies the same random operation to the cache and the reference and compares them."""

    def __init__(self, seed: int, page_size: int, num_pages: int = 40) -> None:
        self.rng = random.Random(seed)
        self.ps = page_size
        self.pool = RecordingPool(num_pages, page_size)
        self.cache = RadixCache(self.pool, page_size)
        self.ref = NaiveReference(page_size)
        # A few page-sized token patterns over a tiny alphabet so keys share prefixes often.
        self.patterns = [tuple(self.rng.randrange(3) for _ in range(page_size)) for _ in range(3)]
        self.known: list[tuple[int, ...]] = []
        self.held: list[tuple[TreeNode, tuple[int, ...]]] = []

    def random_key(self) -> tuple[int, ...]:
        rng = self.rng
        key: list[int] = []
        if self.known and rng.random() < 0.7:
            base = rng.choice(self.known)
            key = list(base[: rng.randrange(len(base) + 1)])  # may cut mid-page
        for _ in range(rng.randrange(4)):
            key.extend(rng.choice(self.patterns))
        if key and rng.random() < 0.2:
            key[rng.randrange(len(key))] = 3 + rng.randrange(4)  # a mismatch inside a page
        return tuple(key)

    def aligned(self, key: tuple[int, ...]) -> tuple[int, ...]:
        return key[: len(key) - len(key) % self.ps]

    def op_match(self, lock: bool) -> None:
        key = self.random_key()
        result = self.cache.match_prefix(key)
        pages, num_tokens, prefix = self.ref.match(self.aligned(key))
        assert (result.page_indices, result.num_tokens) == (pages, num_tokens)
        assert _full_key(result.last_node) == prefix
        if lock:
            self.cache.lock(result.last_node)
            self.ref.add_lock(prefix, +1)
            self.held.append((result.last_node, prefix))

    def op_unlock(self) -> None:
        if self.held:
            node, prefix = self.held.pop(self.rng.randrange(len(self.held)))
            self.cache.unlock(node)
            self.ref.add_lock(prefix, -1)

    def op_evict(self, num_tokens: int) -> int:
        before = len(self.pool.freed)
        evicted = self.cache.evict(num_tokens)
        got = self.pool.freed[before:]
        expected = self.ref.evict(num_tokens)
        assert got == expected
        assert evicted == self.ps * sum(len(b) for b in got)
        return evicted

    def op_insert(self) -> None:
        key = self.aligned(self.random_key())
        if not key:
            return
        self.known.append(key)
        n_pages = len(key) // self.ps
        if self.rng.random() < 0.5:
            # KV-manager flow: match, allocate only the tail, insert prefix + new pages.
            result = self.cache.match_prefix(key)
            ref_pages, _, _ = self.ref.match(key)
            assert result.page_indices == ref_pages
            cached = result.page_indices
        else:
            cached = []  # fresh pages for everything: exercises duplicate freeing
        new = self.alloc(n_pages - len(cached))
        if new is None:
            return
        pages = cached + new
        existing = self.cache.insert(key, pages)
        assert existing == self.ref.insert(key, pages)
        assert existing >= len(cached) * self.ps
        tree_pages = [e.page for e in self.ref._path(key)]
        dup = [p for p, t in zip(pages[: existing // self.ps], tree_pages) if p != t]
        assert dup == new[: max(0, existing // self.ps - len(cached))]
        self.pool.free(dup)

    def alloc(self, n: int) -> list[int] | None:
        pages = self.pool.alloc(n)
        if pages is None:
            self.op_evict((n - self.pool.available_pages) * self.ps)
            pages = self.pool.alloc(n)
        return pages

    def check(self) -> None:
        cache, ref, pool = self.cache, self.ref, self.pool
        cache.check_invariants()
        assert cache.evictable_size() == ref.evictable()
        assert cache.protected_size() == ref.protected()
        assert sorted(cache.all_pages()) == sorted(e.page for e in ref.entries)
        assert pool.available_size + cache.total_size() == pool.total_size

    def sweep(self) -> None:
        """Match every cached leaf key on both sides."""
        leaves = [e.prefix for e in self.ref.entries if not self.ref._has_child(e)]
        for prefix in leaves:
            result = self.cache.match_prefix(prefix)
            pages, num_tokens, _ = self.ref.match(prefix)
            assert (result.page_indices, result.num_tokens) == (pages, len(prefix))
            assert num_tokens == len(prefix)
            self.check()

    def step(self) -> None:
        r = self.rng.random()
        if r < 0.35:
            self.op_insert()
        elif r < 0.65:
            self.op_match(lock=self.rng.random() < 0.3)
        elif r < 0.8:
            self.op_unlock()
        else:
            self.op_evict(self.rng.randrange(0, 8 * self.ps + 1))
        self.check()

    def finish(self) -> None:
        while self.held:
            self.op_unlock()
            self.check()
        total = self.cache.total_size()
        assert self.op_evict(10**9) == total
        self.check()
        assert self.cache.total_size() == 0 and self.ref.entries == []
        assert self.pool.available_pages == self.pool.num_pages


@pytest.mark.parametrize("page_size", [1, 2, 4, 16])
@pytest.mark.parametrize("seed", range(8))
def test_random_ops_match_naive_reference(seed: int, page_size: int) -> None:
    driver = Driver(seed, page_size)
    for i in range(300):
        driver.step()
        if i % 50 == 49:
            driver.sweep()
    driver.finish()
