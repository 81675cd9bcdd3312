"""Free list of KV-cache pages (pure Python, stdlib only).

The KV pool stores keys/values in pages of ``page_size`` tokens. This module only does the
bookkeeping: which page ids are free. Page 0 is reserved as the dummy page that padded tokens
write into, so it is never handed out; pages ``1..num_pages`` are allocatable. The KV slot of
token ``offset`` inside page ``p`` is ``p * page_size + offset``.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["PagePool"]


class PagePool:
    """Free list of KV-cache pages.

    Page 0 is reserved (a dummy page padded writes go to); pages ``1..num_pages`` are allocatable.
    A token slot is ``page * page_size + offset``. Reuse is LIFO (most recently freed first); a
    fresh pool hands out ascending ids, so ``PagePool(8, 1).alloc(3) == [1, 2, 3]``.
    """

    __slots__ = ("num_pages", "page_size", "_free", "_is_free")

    def __init__(self, num_pages: int, page_size: int) -> None:
        """Create a pool with every page free.

        Args:
            num_pages: number of allocatable pages (page 0 excluded); >= 0.
            page_size: tokens per page; a power of two >= 1.

        Raises:
            ValueError: on a negative ``num_pages`` or a ``page_size`` that is not a power of two.
        """
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        if page_size < 1 or page_size & (page_size - 1):
            raise ValueError(f"page_size must be a power of two >= 1, got {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        # Stack of free page ids; the top (end) is handed out first.
        self._free: list[int] = []
        # _is_free[p] == 1 iff page p is free; O(1) double-free check. Index 0 stays 0 forever.
        self._is_free = bytearray(num_pages + 1)
        self.clear()

    @property
    def available_pages(self) -> int:
        """Number of free pages."""
        return len(self._free)

    @property
    def available_size(self) -> int:
        """Number of free token slots (free pages * page_size)."""
        return len(self._free) * self.page_size

    @property
    def total_size(self) -> int:
        """Token slots in all allocatable pages (num_pages * page_size)."""
        return self.num_pages * self.page_size

    def alloc(self, n: int) -> list[int] | None:
        """Take ``n`` pages off the free list in O(n).

        Returns:
            ``n`` distinct page ids in ``1..num_pages``, or ``None`` if fewer than ``n`` pages are
            free (nothing is allocated then). ``alloc(0) == []``.

        Raises:
            ValueError: if ``n`` is negative.
        """
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of pages: {n}")
        if n > len(self._free):
            return None
        if n == 0:
            return []
        pages = self._free[-n:]
        del self._free[-n:]
        pages.reverse()
        is_free = self._is_free
        for page in pages:
            is_free[page] = 0
        return pages

    def free(self, pages: Iterable[int]) -> None:
        """Return pages to the pool; all or nothing.

        Raises:
            ValueError: if a page is out of range (0 included: it is reserved) or already free
                (double free, also within this call). The pool is unchanged then.
        """
        is_free = self._is_free
        num_pages = self.num_pages
        freed: list[int] = []
        for page in pages:
            if not 1 <= page <= num_pages:
                self._rollback(freed)
                raise ValueError(f"page {page} out of range 1..{num_pages}")
            if is_free[page]:
                self._rollback(freed)
                raise ValueError(f"double free of page {page}")
            is_free[page] = 1
            freed.append(page)
        self._free.extend(freed)

    def is_free(self, page: int) -> bool:
        """Whether ``page`` is currently free; False for page 0 and out-of-range ids."""
        return 0 <= page <= self.num_pages and bool(self._is_free[page])

    def clear(self) -> None:
        """Make every page free again (ascending ids are handed out first)."""
        self._free = list(range(self.num_pages, 0, -1))
        self._is_free = bytearray(b"\x01") * (self.num_pages + 1)
        self._is_free[0] = 0

    def _rollback(self, freed: list[int]) -> None:
        for page in freed:
            self._is_free[page] = 0

    def __repr__(self) -> str:
        return (
            f"PagePool(num_pages={self.num_pages}, page_size={self.page_size}, "
            f"available_pages={self.available_pages})"
        )
