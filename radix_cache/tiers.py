"""Bookkeeping of the KV tiers below the radix tree: host memory and storage (pure Python, stdlib only).

The radix tree holds the pages that live in the device KV pool. A page that leaves it (eviction) or
that is backed up at insert (``write_through``) is remembered here under the **chain digest** of its
token prefix: ``d_0 = H(page_0)``, ``d_i = H(d_{i-1} || page_i)`` with ``H`` = BLAKE2b-128 over the
page's token ids as little-endian int64. A digest names the whole prefix up to and including its
page, so the entries form a tree of pages (each entry's parent is the entry of the digest before it)
and a lookup walks it page by page below the device match, exactly like a radix match. The same
digests name the storage tier's page files, so they must not depend on the process (no ``hash()``).

``TierListener`` is the seam the radix tree calls (``RadixCache(listener=...)``); the byte movement
behind it lives in ``radixlm.managers.hicache_controller`` (torch), never here.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Optional, Protocol

from .page_pool import PagePool

__all__ = ["DIGEST_SIZE", "HostTierIndex", "TierListener", "page_digests"]

DIGEST_SIZE = 16  # bytes of a chain digest


class TierListener(Protocol):
    """What the radix tree tells the tiers below it. Keys are token ids, pages are device page ids."""

    def on_insert(self, key: tuple[int, ...], start: int, pages: Sequence[int]) -> None:
        """``key[start:]`` (page-aligned, ``len(pages) * page_size`` tokens) was just inserted, holding
        ``pages``; ``key[:start]`` was already in the tree."""

    def on_evict(self, key: tuple[int, ...], pages: Sequence[int]) -> None:
        """The pages of the last ``len(pages)`` pages of ``key`` (the whole prefix from the root) are
        about to go back to the free list; their contents are still intact."""


def page_digests(tokens: Sequence[int], page_size: int, start: int = 0,
                 prev: Optional[bytes] = None) -> list[bytes]:
    """Chain digests of the whole pages of ``tokens[start:]`` (``start`` page-aligned).

    ``prev`` is the digest of the page before ``start`` (None when ``start == 0``). Returns one
    ``DIGEST_SIZE``-byte digest per whole page; a partial last page gets none.

    Raises:
        ValueError: if ``start`` is not a multiple of ``page_size`` or ``prev`` is missing for ``start > 0``.
    """
    if start % page_size:
        raise ValueError(f"start {start} is not a multiple of page_size {page_size}")
    if start and prev is None:
        raise ValueError("page_digests from start > 0 needs the previous page's digest")
    n_pages = (len(tokens) - start) // page_size
    fmt = f"<{page_size}q"
    out: list[bytes] = []
    digest = prev or b""
    blake2b = hashlib.blake2b
    for i in range(n_pages):
        lo = start + i * page_size
        digest = blake2b(digest + struct.pack(fmt, *tokens[lo:lo + page_size]), digest_size=DIGEST_SIZE).digest()
        out.append(digest)
    return out


class HostTierIndex:
    """Which prefix pages have a copy in the host pool: chain digest -> host page id, LRU.

    Host page ids come from ``pool`` (a ``PagePool`` over the host pool's pages). ``add`` evicts the
    least recently used entries when the pool is full; ``touch`` refreshes entries. Lookups touch in
    reverse page order, so an entry is always more recent than its descendants and eviction takes
    the deepest pages first (a prefix never disappears before its extensions).
    """

    def __init__(self, pool: PagePool) -> None:
        self.pool = pool
        self._entries: OrderedDict[bytes, int] = OrderedDict()  # least recently used first
        self.num_evicted = 0  # pages dropped from the host tier since start (LRU)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._entries

    @property
    def capacity_pages(self) -> int:
        return self.pool.num_pages

    def lookup(self, digest: bytes) -> Optional[int]:
        """The host page holding ``digest``'s page, or None (does not refresh it)."""
        return self._entries.get(digest)

    def touch(self, digests: Iterable[bytes]) -> None:
        """Mark entries as used now, in reverse order (see the class docstring); unknown ones are skipped."""
        entries = self._entries
        for d in reversed(list(digests)):
            if d in entries:
                entries.move_to_end(d)

    def add(self, digest: bytes) -> Optional[int]:
        """A host page for a new entry ``digest`` (the caller copies the data in), evicting LRU entries
        if the pool is full. An existing entry is refreshed and its page returned. None only when the
        pool has no pages at all."""
        entries = self._entries
        page = entries.get(digest)
        if page is not None:
            entries.move_to_end(digest)
            return page
        if self.pool.available_pages == 0:
            if not entries:
                return None
            _, old = entries.popitem(last=False)
            self.pool.free([old])
            self.num_evicted += 1
        got = self.pool.alloc(1)
        assert got is not None
        entries[digest] = got[0]
        return got[0]

    def clear(self) -> None:
        """Forget every entry (``/flush_cache``)."""
        self._entries.clear()
        self.pool.clear()

    def used_pages(self) -> int:
        return len(self._entries)

    def check_invariants(self) -> None:
        """Every host page is either free or held by exactly one entry.

        Raises:
            AssertionError: naming the violation (a host-pool leak or double use).
        """
        pages = list(self._entries.values())
        if len(set(pages)) != len(pages):
            raise AssertionError("host tier: a host page is held by two entries")
        for p in pages:
            if self.pool.is_free(p):
                raise AssertionError(f"host tier: page {p} is indexed but free in the host pool")
        if len(pages) + self.pool.available_pages != self.pool.num_pages:
            raise AssertionError(f"host pool leak: {len(pages)} indexed + {self.pool.available_pages} free != "
                                 f"{self.pool.num_pages} pages")
