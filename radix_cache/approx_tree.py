"""The cache-aware router's approximate radix tree: which prompts were sent to which replica.

One tree over token ids holds every replica ("tenant", an int) at once, the structure of SGLang's
router (``sgl-router/src/policies/tree.rs``): a node records, per tenant, the logical time it was
last routed through it. Invariant: a tenant present at a node is present at every ancestor (inserts
mark the whole path; pruning only removes a tenant where it is a leaf), so the longest prefix a
tenant holds ends at the deepest node on the key's path that lists it.

It is *approximate*: the tree says where prompts were sent, not what each replica's radix cache
still holds. Pruning keeps each tenant's size (tokens it holds, shared prefixes counted once per
tenant) at most ``max_size``, dropping the least recently routed leaves first, as the replica's own
cache evicts its least recently used leaves. Keys are token ids (the HTTP process has them already,
and they match what the replica's radix tree is keyed by); SGLang's router, in front of HTTP servers,
uses characters. No torch.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Optional


class _Node:
    __slots__ = ("key", "children", "tenants", "parent")

    def __init__(self, key: list[int], parent: Optional["_Node"]) -> None:
        self.key = key  # token ids on the edge from the parent into this node
        self.children: dict[int, _Node] = {}  # first token of the child's key -> child
        self.tenants: dict[int, int] = {}  # tenant -> logical time it last routed through this node
        self.parent = parent


def _shared(a: Sequence[int], b: Sequence[int], start: int) -> int:
    """Length of the common prefix of ``a`` and ``b[start:]``."""
    n = min(len(a), len(b) - start)
    if list(b[start:start + n]) == list(a[:n]):  # one C-level comparison in the usual full-match case
        return n
    i = 0
    while i < n and a[i] == b[start + i]:
        i += 1
    return i


class ApproxPrefixTree:
    """Multi-tenant radix tree over token ids with per-tenant size accounting and LRU pruning.

    Args:
        max_size: the most tokens one tenant may hold; ``insert`` prunes that tenant's least
            recently routed leaves once it holds more, down to ``prune_to`` of it (hysteresis: one
            scan of the tree per prune, not per insert). ``None``: unbounded.
        prune_to: fraction of ``max_size`` a prune leaves (0 < prune_to <= 1).
    """

    def __init__(self, max_size: Optional[int] = None, prune_to: float = 0.875) -> None:
        if max_size is not None and max_size < 1:
            raise ValueError(f"max_size must be >= 1 token, got {max_size}")
        if not 0 < prune_to <= 1:
            raise ValueError(f"prune_to must be in (0, 1], got {prune_to}")
        self.max_size = max_size
        self.prune_to = prune_to
        self.root = _Node([], None)
        self._sizes: dict[int, int] = {}
        self._clock = 0

    # ---- queries ---------------------------------------------------------------------------------
    def size(self, tenant: int) -> int:
        """Tokens ``tenant`` holds (0 for an unknown tenant)."""
        return self._sizes.get(tenant, 0)

    def match(self, key: Sequence[int]) -> dict[int, int]:
        """For every tenant holding a prefix of ``key``: the length (tokens) of its longest one.
        Read-only (no LRU refresh: the caller inserts the key for the tenant it picks)."""
        out: dict[int, int] = {}
        node, depth = self.root, 0
        while depth < len(key):
            child = node.children.get(key[depth])
            if child is None:
                break
            shared = _shared(child.key, key, depth)
            depth += shared
            for tenant in child.tenants:
                out[tenant] = depth  # deeper nodes overwrite: their tenants are a subset of the parent's
            if shared < len(child.key):
                break
            node = child
        return out

    # ---- updates ---------------------------------------------------------------------------------
    def insert(self, key: Sequence[int], tenant: int) -> None:
        """Record that ``key`` was routed to ``tenant`` (marks every node on its path as just used),
        then prune ``tenant`` if it now holds more than ``max_size`` tokens."""
        self._clock += 1
        now = self._clock
        self._sizes.setdefault(tenant, 0)
        node, depth = self.root, 0
        while depth < len(key):
            child = node.children.get(key[depth])
            if child is None:
                child = _Node(list(key[depth:]), node)
                node.children[key[depth]] = child
                depth = len(key)
            else:
                shared = _shared(child.key, key, depth)
                if shared < len(child.key):
                    child = self._split(child, shared)
                depth += shared
            if tenant not in child.tenants:
                self._sizes[tenant] += len(child.key)
            child.tenants[tenant] = now
            node = child
        if self.max_size is not None and self._sizes[tenant] > self.max_size:
            self.prune(tenant, int(self.max_size * self.prune_to))

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut ``node``'s key after ``at`` tokens; returns the new upper node (same tenants, so
        every tenant's size is unchanged)."""
        parent = node.parent
        assert parent is not None
        upper = _Node(node.key[:at], parent)
        upper.tenants = dict(node.tenants)
        parent.children[upper.key[0]] = upper
        node.key = node.key[at:]
        node.parent = upper
        upper.children[node.key[0]] = node
        return upper

    def prune(self, tenant: int, target: int) -> None:
        """Remove ``tenant`` from its least recently routed leaves until it holds at most
        ``target`` tokens. A node no tenant holds any more is deleted."""
        if self._sizes.get(tenant, 0) <= target:
            return
        heap: list[tuple[int, int, _Node]] = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node is not self.root and self._is_leaf_of(node, tenant):
                heap.append((node.tenants[tenant], id(node), node))
        heapq.heapify(heap)
        while heap and self._sizes[tenant] > target:
            _, _, node = heapq.heappop(heap)
            del node.tenants[tenant]
            self._sizes[tenant] -= len(node.key)
            parent = node.parent
            assert parent is not None
            if not node.tenants and not node.children:
                del parent.children[node.key[0]]
            if parent is not self.root and self._is_leaf_of(parent, tenant):
                heapq.heappush(heap, (parent.tenants[tenant], id(parent), parent))

    @staticmethod
    def _is_leaf_of(node: _Node, tenant: int) -> bool:
        return tenant in node.tenants and not any(tenant in c.tenants for c in node.children.values())

    def remove_tenant(self, tenant: int) -> None:
        """Forget everything routed to ``tenant`` (its replica's cache was flushed)."""
        self.prune(tenant, 0)
        self._sizes.pop(tenant, None)

    def num_nodes(self) -> int:
        """Nodes below the root (for tests and debugging)."""
        count, stack = 0, list(self.root.children.values())
        while stack:
            node = stack.pop()
            count += 1
            stack.extend(node.children.values())
        return count
