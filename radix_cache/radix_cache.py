"""Radix tree over token ids whose values are KV page indices (pure Python, stdlib only).

Units: keys, ``num_tokens`` and every size are in **tokens**; values are **page ids**, one per
``page_size`` tokens. Every node key is page-aligned: ``len(node.key) == len(node.value) *
page_size``. A child is keyed in its parent's dict by its first token (``page_size == 1``) or by
the tuple of its first page of tokens, so a lookup already proves the first page matches.

Access times come from a per-cache counter bumped once per ``match_prefix``/``insert`` call, so
eviction order is deterministic (no wall clock). Only the matched part of a path is refreshed:
when a match ends inside a node, the node is split and only the upper half gets the new time.
"""

from __future__ import annotations

import heapq
from itertools import chain
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Union

from .page_pool import PagePool
from .tiers import TierListener

__all__ = ["MatchResult", "RadixCache", "RadixCacheInvariantError", "TreeNode"]

ChildKey = Union[int, tuple[int, ...]]


class RadixCacheInvariantError(AssertionError):
    """Raised by ``RadixCache.check_invariants`` when the tree's bookkeeping is inconsistent."""


class TreeNode:
    """One edge segment of the radix tree.

    ``key`` holds the segment's token ids (a tuple, page-aligned); ``value`` its page ids
    (``len(key) // page_size`` of them). ``lock_ref`` counts locks held on this node or any
    descendant; a node with ``lock_ref > 0`` is protected from eviction. ``detached`` is set once
    the node has been evicted or the cache reset; such a node must not be locked again.
    """

    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access", "id", "detached")

    def __init__(
        self,
        node_id: int,
        key: tuple[int, ...],
        value: list[int],
        parent: TreeNode | None,
        last_access: int,
        lock_ref: int = 0,
    ) -> None:
        self.children: dict[ChildKey, TreeNode] = {}
        self.parent = parent
        self.key = key
        self.value = value
        self.lock_ref = lock_ref
        self.last_access = last_access
        self.id = node_id
        self.detached = False

    def __repr__(self) -> str:
        return (
            f"TreeNode(id={self.id}, tokens={len(self.key)}, pages={len(self.value)}, "
            f"lock_ref={self.lock_ref}, last_access={self.last_access})"
        )


@dataclass(frozen=True, slots=True)
class MatchResult:
    """Result of ``RadixCache.match_prefix``.

    ``page_indices``: page ids of the matched prefix, in order (``num_tokens // page_size``).
    ``num_tokens``: matched length in tokens (a multiple of ``page_size``).
    ``last_node``: the node whose key ends exactly at ``num_tokens`` (the root if nothing
    matched); pass it to ``lock``/``unlock``.
    """

    page_indices: list[int]
    num_tokens: int
    last_node: TreeNode


class RadixCache:
    """Prefix cache mapping token-id prefixes to KV pages, with LRU eviction of unlocked leaves.

    The tree owns the pages it holds: ``evict``/``reset`` free them to ``pool``. Pages the caller
    passes to ``insert`` beyond the already-cached prefix become owned by the tree.
    Size identity (when every page is either free or in the tree):
    ``pool.available_size + evictable_size() + protected_size() == pool.total_size``.
    """

    def __init__(self, pool: PagePool, page_size: int, disable: bool = False,
                 listener: TierListener | None = None) -> None:
        """Create an empty tree. ``listener`` (the hierarchical cache) hears of every inserted tail
        and every evicted leaf before its pages are freed; ``reset`` tells it nothing.

        Raises:
            ValueError: if ``page_size`` differs from ``pool.page_size``.
        """
        if page_size != pool.page_size:
            raise ValueError(f"page_size {page_size} != pool.page_size {pool.page_size}")
        self.pool = pool
        self.page_size = page_size
        self.disable = disable
        self.listener = listener
        self._clock = 0
        self._next_id = 0
        self._evictable = 0
        self._protected = 0
        self.root = self._new_node((), [], None)

    # ----------------------------------------------------------------- lookup and insertion

    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        """Longest cached prefix of ``key``, truncated down to a page multiple.

        Splits the node the match ends inside, so ``last_node`` ends exactly at ``num_tokens``,
        and refreshes the access time of the matched path. The caller must pass ``key[:-1]`` if
        the last input token has to be recomputed; this method does not do it. Disabled cache:
        empty match at the root.
        """
        if self.disable:
            return MatchResult([], 0, self.root)
        tkey = self._aligned_tuple(key)
        pages: list[int] = []
        node, num_tokens = self._walk(tkey, pages)
        return MatchResult(pages, num_tokens, node)

    def continuation(self, key: Sequence[int], max_tokens: int) -> list[int]:
        """Tokens the tree holds right after the whole of ``key``: up to ``max_tokens`` of what some
        earlier sequence continued with after this exact context (speculative drafts).

        Read-only: no split, no access-time refresh, no lock. ``key`` need not be page-aligned.
        Where the path branches, the most recently used child is followed. Returns [] when the
        tree does not hold all of ``key`` followed by at least one more token (or is disabled).
        """
        if self.disable or max_tokens <= 0:
            return []
        node, pos, end = self.root, 0, len(key)
        out: list[int] = []
        while len(out) < max_tokens:
            if pos >= end:  # the context is matched: follow the freshest path down
                if not node.children:
                    break
                node = max(node.children.values(), key=lambda c: c.last_access)
                out.extend(node.key[: max_tokens - len(out)])
                continue
            rest = key[pos:]
            child = self._continuation_child(node, rest)
            if child is None:
                return []
            ckey = child.key
            n = min(len(ckey), len(rest))
            if tuple(rest[:n]) != ckey[:n]:
                return []
            if n < len(ckey):  # the context ends inside this node
                out.extend(ckey[n : n + max_tokens])
                node, pos = child, end
                continue
            node, pos = child, pos + n
        return out[:max_tokens]

    def _continuation_child(self, node: TreeNode, rest: Sequence[int]) -> TreeNode | None:
        """The child whose key could start with ``rest`` (a shorter-than-a-page ``rest`` may
        begin several children: the most recently used one)."""
        if self.page_size == 1:
            return node.children.get(rest[0])
        if len(rest) >= self.page_size:
            return node.children.get(tuple(rest[: self.page_size]))
        head = tuple(rest)
        fits = [c for k, c in node.children.items() if k[: len(head)] == head]  # type: ignore[index]
        return max(fits, key=lambda c: c.last_access) if fits else None

    def insert(self, key: Sequence[int], pages: Sequence[int]) -> int:
        """Cache ``pages`` for ``key`` (one page per ``page_size`` tokens).

        Walks and splits like ``match_prefix``, then attaches a leaf for the uncached tail holding
        ``pages[existing // page_size:]``; those pages now belong to the tree.

        Returns:
            ``existing``: the number of leading tokens of ``key`` already in the tree, for which
            the tree did NOT take the caller's pages. The caller must free each of its pages in
            ``pages[:existing // page_size]`` that differs from the tree's (re-match to learn
            them). Disabled cache: stores nothing and returns ``len(key)``.

        Raises:
            ValueError: if ``len(key)`` is not a multiple of ``page_size`` or is not
                ``len(pages) * page_size``.
        """
        page_size = self.page_size
        if len(key) % page_size or len(key) != len(pages) * page_size:
            raise ValueError(
                f"insert needs a page-aligned key with one page per {page_size} tokens; "
                f"got {len(key)} tokens and {len(pages)} pages"
            )
        if self.disable:
            return len(key)
        tkey = key if isinstance(key, tuple) else tuple(key)
        node, existing = self._walk(tkey, None)
        if existing < len(tkey):
            tail = pages[existing // page_size :]  # a fresh list when pages is a list
            value = tail if isinstance(tail, list) else list(tail)
            leaf = self._new_node(tkey[existing:], value, node)
            node.children[self._child_key(leaf.key, 0)] = leaf
            self._evictable += len(leaf.key)
            if self.listener is not None:
                self.listener.on_insert(tkey, existing, value)
        return existing

    # ------------------------------------------------------------------------------ locking

    def lock(self, node: TreeNode) -> None:
        """Protect ``node`` and its ancestors from eviction (ref count; the root is a no-op).

        On each 0->1 transition the node's tokens move from evictable to protected.

        Raises:
            ValueError: if ``node`` was evicted or dropped by ``reset``.
        """
        if node.detached:
            raise ValueError(f"cannot lock a detached node: {node!r}")
        root = self.root
        while node is not root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]  # non-root nodes always have a parent

    def unlock(self, node: TreeNode) -> None:
        """Undo one ``lock(node)``; on each 1->0 transition tokens move back to evictable.

        Raises:
            ValueError: if ``node`` (not the root) is not locked. Ancestors' counts are >= the
                node's, so checking the node alone guarantees nothing goes below 0.
        """
        root = self.root
        if node is not root and node.lock_ref <= 0:
            raise ValueError(f"unlock of a node that is not locked: {node!r}")
        while node is not root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._protected -= len(node.key)
                self._evictable += len(node.key)
            node = node.parent  # type: ignore[assignment]

    # ----------------------------------------------------------------------------- eviction

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` tokens of unlocked leaves, least recently used first.

        Whole leaf nodes are evicted (so it may overshoot by less than one node); a parent that
        becomes an unlocked leaf joins the candidates (cascade). Stops early when nothing
        evictable is left. Each evicted node's pages go to ``pool.free`` in one call.

        Returns:
            Tokens evicted (a multiple of ``page_size``).
        """
        if num_tokens <= 0 or self.disable:
            return 0
        root = self.root
        heap = [
            (node.last_access, node.id, node)
            for node in self._iter_nodes()
            if not node.children and node.lock_ref == 0 and node is not root
        ]
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            if self.listener is not None:
                self.listener.on_evict(self.full_key(leaf), leaf.value)
            self.pool.free(leaf.value)
            del parent.children[self._child_key(leaf.key, 0)]
            leaf.detached = True
            self._evictable -= len(leaf.key)
            evicted += len(leaf.key)
            if parent is not root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return evicted

    def reset(self) -> None:
        """Free every page held by the tree back to the pool and empty the tree.

        Raises:
            RuntimeError: if any node is locked (a running request still uses the tree).
        """
        if self._protected:
            raise RuntimeError(f"reset with {self._protected} protected tokens still locked")
        for node in self._iter_nodes():
            if node is not self.root:
                self.pool.free(node.value)
                node.detached = True
        self.root.children = {}
        self._evictable = 0

    # -------------------------------------------------------------------------------- sizes

    def evictable_size(self) -> int:
        """Tokens in unlocked nodes."""
        return self._evictable

    def protected_size(self) -> int:
        """Tokens in locked nodes."""
        return self._protected

    def total_size(self) -> int:
        """Tokens held by the tree (evictable + protected)."""
        return self._evictable + self._protected

    def full_key(self, node: TreeNode) -> tuple[int, ...]:
        """The tokens from the root to the end of ``node`` (O(depth) concatenation)."""
        parts: list[tuple[int, ...]] = []
        while node is not self.root:
            parts.append(node.key)
            node = node.parent  # type: ignore[assignment]
        return tuple(chain.from_iterable(reversed(parts)))

    # -------------------------------------------------------------------------- diagnostics

    def all_pages(self) -> list[int]:
        """Every page id held by the tree (depth-first order)."""
        pages: list[int] = []
        for node in self._iter_nodes():
            pages.extend(node.value)
        return pages

    def check_invariants(self) -> None:
        """Verify the tree's bookkeeping in O(tree size).

        Raises:
            RadixCacheInvariantError: naming the first violated invariant.
        """
        _check_tree(self)

    def pretty_print(self) -> str:
        """Human-readable dump: one line per node, indented by depth."""
        lines = [
            f"RadixCache(page_size={self.page_size}, evictable={self._evictable}, "
            f"protected={self._protected}, disable={self.disable})"
        ]
        stack: list[tuple[TreeNode, int]] = [(c, 1) for c in reversed(self.root.children.values())]
        while stack:
            node, depth = stack.pop()
            key = list(node.key[:16])
            more = f"...+{len(node.key) - 16}" if len(node.key) > 16 else ""
            lines.append(
                f"{'  ' * depth}{key}{more} pages={node.value} "
                f"lock_ref={node.lock_ref} t={node.last_access}"
            )
            stack.extend((c, depth + 1) for c in reversed(node.children.values()))
        return "\n".join(lines)

    # ----------------------------------------------------------------------------- internals

    def _walk(self, tkey: tuple[int, ...], pages: list[int] | None) -> tuple[TreeNode, int]:
        """Follow ``tkey`` (page-aligned) from the root; split where the match ends mid-node.

        Refreshes matched nodes' access times and appends their pages to ``pages`` if given.
        Returns the exact last matched node and the matched length in tokens.
        """
        self._clock += 1
        now = self._clock
        page_size = self.page_size
        node = self.root
        pos = 0
        end = len(tkey)
        while pos < end:
            # Inlined _child_key: this loop runs once per node on every match and insert.
            child_key: ChildKey = tkey[pos] if page_size == 1 else tkey[pos : pos + page_size]
            child = node.children.get(child_key)
            if child is None:
                break
            ckey = child.key
            if tkey[pos : pos + len(ckey)] == ckey:  # whole node matched (one C-level compare)
                matched = len(ckey)
            else:
                matched = self._match_len(ckey, tkey, pos)
                child = self._split(child, matched)
            child.last_access = now
            if pages is not None:
                pages.extend(child.value)
            node = child
            pos += matched
        return node, pos

    def _match_len(self, ckey: tuple[int, ...], tkey: tuple[int, ...], pos: int) -> int:
        """Page-aligned common prefix length of ``ckey`` and ``tkey[pos:]``, known to be shorter
        than ``len(ckey)`` (the key ends or differs inside the node).

        The caller found ``ckey`` through its child key, so the first page is known equal.
        """
        limit = min(len(ckey), len(tkey) - pos)
        if ckey[:limit] == tkey[pos : pos + limit]:
            return limit  # the key ends inside the node (limit is page-aligned)
        # Skip equal 64-token chunks with C-level slice compares, then find the exact token.
        i = self.page_size
        while i + 64 <= limit and ckey[i : i + 64] == tkey[pos + i : pos + i + 64]:
            i += 64
        while ckey[i] == tkey[pos + i]:
            i += 1
        return i - i % self.page_size

    def _split(self, child: TreeNode, split_len: int) -> TreeNode:
        """Split ``child`` at ``split_len`` tokens (page-aligned, 0 < split_len < len(key)).

        The new upper node takes ``child``'s place in its parent and inherits its lock_ref and
        access time (sizes are unchanged: both halves have the same lock state).
        """
        parent = child.parent
        assert parent is not None
        split_pages = split_len // self.page_size
        upper = self._new_node(
            child.key[:split_len], child.value[:split_pages], parent, child.lock_ref
        )
        upper.last_access = child.last_access
        child.key = child.key[split_len:]
        child.value = child.value[split_pages:]
        child.parent = upper
        upper.children[self._child_key(child.key, 0)] = child
        parent.children[self._child_key(upper.key, 0)] = upper
        return upper

    def _child_key(self, tkey: tuple[int, ...], pos: int) -> ChildKey:
        if self.page_size == 1:
            return tkey[pos]
        return tkey[pos : pos + self.page_size]

    def _aligned_tuple(self, key: Sequence[int]) -> tuple[int, ...]:
        tkey = key if isinstance(key, tuple) else tuple(key)
        excess = len(tkey) % self.page_size
        return tkey[: len(tkey) - excess] if excess else tkey

    def _new_node(
        self, key: tuple[int, ...], value: list[int], parent: TreeNode | None, lock_ref: int = 0
    ) -> TreeNode:
        self._next_id += 1
        return TreeNode(self._next_id, key, value, parent, self._clock, lock_ref)

    def _iter_nodes(self) -> Iterator[TreeNode]:
        """Depth-first pre-order over all nodes, root included."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())


def _check_tree(cache: RadixCache) -> None:
    """Body of ``RadixCache.check_invariants`` (kept apart to keep the class readable)."""

    def fail(msg: str, node: TreeNode | None = None) -> None:
        where = f" at {node!r}" if node is not None else ""
        raise RadixCacheInvariantError(f"radix cache invariant violated: {msg}{where}")

    page_size, pool, root = cache.page_size, cache.pool, cache.root
    if root.key or root.value or root.lock_ref or root.parent is not None:
        fail("root must have an empty key/value, lock_ref 0 and no parent", root)
    evictable = protected = 0
    seen: set[int] = set()
    for node in cache._iter_nodes():
        for child_key, child in node.children.items():
            if child.parent is not node:
                fail("child's parent pointer is wrong", child)
            if not child.key:
                fail("non-root node with an empty key", child)
            if child_key != cache._child_key(child.key, 0):
                fail(f"child dict key {child_key!r} is not the child's first page", child)
            if node is not root and node.lock_ref < child.lock_ref:
                fail(f"parent lock_ref {node.lock_ref} < child lock_ref {child.lock_ref}", child)
        if node is root:
            continue
        if node.detached:
            fail("detached node still in the tree", node)
        if len(node.key) % page_size or len(node.key) != len(node.value) * page_size:
            fail(f"key of {len(node.key)} tokens vs {len(node.value)} pages", node)
        if node.lock_ref < 0:
            fail("negative lock_ref", node)
        if node.lock_ref:
            protected += len(node.key)
        else:
            evictable += len(node.key)
        for page in node.value:
            if page in seen:
                fail(f"page {page} appears twice", node)
            seen.add(page)
            if not 1 <= page <= pool.num_pages:
                fail(f"page {page} out of range 1..{pool.num_pages}", node)
            if pool.is_free(page):
                fail(f"page {page} is in the tree but free in the pool", node)
    if evictable != cache.evictable_size() or protected != cache.protected_size():
        fail(
            f"recomputed evictable/protected {evictable}/{protected} != counters "
            f"{cache.evictable_size()}/{cache.protected_size()}"
        )
    if cache.disable and (root.children or evictable or protected):
        fail("a disabled cache must stay empty")
