"""KV bookkeeping between requests, the page pool and the radix tree.

Follows SGLang's ``alloc_for_extend``/``cache_unfinished_req``/``cache_finished_req``. Ownership of a
request's ``req_to_token`` row: positions ``[0, cache_protected_len)`` use pages owned by the tree
(pinned by a lock on ``req.last_node``); positions ``[cache_protected_len, num_allocated)`` use pages
owned by the request. ``cache_protected_len`` is always page-aligned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from radixlm.managers.schedule_batch import Req
from radixlm.radix_cache import PagePool, RadixCache
from radixlm.srt.kv_pool import ReqToTokenPool

if TYPE_CHECKING:
    from radixlm.managers.hicache_controller import HiCacheController


class KVManager:
    def __init__(self, page_pool: PagePool, tree: RadixCache, req_to_token_pool: ReqToTokenPool,
                 tiers: Optional["HiCacheController"] = None):
        self.pool = page_pool
        self.tiers = tiers  # the hierarchical cache below the tree (host pool, storage), if on
        self.tree = tree
        self.req_to_token_pool = req_to_token_pool
        self.page_size = page_pool.page_size
        self.total_tokens = page_pool.num_pages * page_pool.page_size

    # ---- capacity ----------------------------------------------------------------------
    def available_tokens(self) -> int:
        """Tokens that could be allocated now, counting what eviction would free."""
        return self.pool.available_size + self.tree.evictable_size()

    def alloc_pages(self, n: int) -> Optional[list[int]]:
        """``n`` free device pages, evicting unlocked tree leaves if needed; None when even that is short."""
        if n <= 0:
            return []
        short = n - self.pool.available_pages
        if short > 0:
            self.tree.evict(short * self.page_size)
        return self.pool.alloc(n)

    def pages_needed(self, req: Req, num_new: int) -> int:
        """New pages to hold ``num_new`` more tokens after ``req.num_cached``."""
        ps = self.page_size
        return -(-(req.num_cached + num_new) // ps) - (-(-req.num_cached // ps))

    # ---- prefix matching -----------------------------------------------------------------
    def match_and_lock(self, req: Req) -> bool:
        """Give a fresh request a row and its cached prefix from the tree (locked).

        Returns False (holding nothing) when no row is free.
        """
        row = self.req_to_token_pool.alloc()
        if row is None:
            return False
        req.req_pool_idx = row
        key = req.fill_ids[:req.match_limit()]
        m = self.tree.match_prefix(key)
        self.tree.lock(m.last_node)
        if self.tiers is not None:  # continue the match in host memory and storage, loading pages back
            m, req.match_tiers = self.tiers.load_back(self, key, m, req.rid)
        req.last_node = m.last_node
        req.num_cached = req.cache_protected_len = m.num_tokens
        if m.num_tokens:
            self._write_pages(row, 0, m.page_indices)
        return True

    def peek_prefix_len(self, req: Req) -> int:
        """Length of the cached prefix a fresh request would get (no locking, no allocation)."""
        return self.tree.match_prefix(req.fill_ids[:req.match_limit()]).num_tokens

    # ---- allocation ----------------------------------------------------------------------
    def alloc_tokens(self, req: Req, num_new: int) -> Optional[list[int]]:
        """KV slots for positions ``[num_cached, num_cached + num_new)`` of ``req``, filling the
        request's partial last page first; None (allocating nothing) when memory is short."""
        ps = self.page_size
        start = req.num_cached
        pages = self.alloc_pages(self.pages_needed(req, num_new))
        if pages is None:
            return None
        row = req.req_pool_idx
        table = self.req_to_token_pool.req_to_token[row]
        slots: list[int] = []
        pos = start
        if start % ps:
            first_slot = int(table[start - 1]) + 1  # same page, next offset
            take = min(ps - start % ps, num_new)
            slots.extend(range(first_slot, first_slot + take))
            pos += take
        for p in pages:
            take = min(ps, start + num_new - pos)
            slots.extend(range(p * ps, p * ps + take))
            pos += take
        table[start:start + num_new] = torch.tensor(slots, dtype=torch.int64)
        return slots

    def alloc_decode(self, reqs: list[Req]) -> Optional[list[int]]:
        """One KV slot per request for position ``req.num_cached`` (a decode step), with one table
        read and one table write for the whole batch instead of per-request tensor ops. Returns the
        slots in ``reqs`` order, or None (allocating nothing) when memory is short."""
        ps = self.page_size
        new_page = [r.num_cached % ps == 0 for r in reqs]
        pages = self.alloc_pages(sum(new_page))
        if pages is None:
            return None
        table = self.req_to_token_pool.req_to_token
        rows = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64)
        cols = torch.tensor([r.num_cached for r in reqs], dtype=torch.int64)
        if all(new_page):
            slots = [p * ps for p in pages]
        else:  # a partial last page continues at the next offset of the previous slot
            prev = table[rows, cols - 1].tolist()
            it = iter(pages)
            slots = [next(it) * ps if fresh else last + 1 for fresh, last in zip(new_page, prev)]
        table[rows, cols] = torch.tensor(slots, dtype=torch.int64)
        return slots

    def free_beyond_cached(self, req: Req, end: int) -> None:
        """Free ``req``'s pages that hold only positions in ``[num_cached, end)``: slots of
        speculative tokens that were rejected (or cut by a stop), allocated by ``alloc_tokens`` up
        to ``end``. The page holding position ``num_cached - 1`` stays (its later slots are reused
        by the next allocation)."""
        ps = self.page_size
        first = -(-req.num_cached // ps) * ps
        last = -(-end // ps) * ps
        if last > first:
            self.pool.free(self._row_pages(req.req_pool_idx, first, last))  # type: ignore[arg-type]

    def _write_pages(self, row: int, start: int, pages: list[int]) -> None:
        ps = self.page_size
        idx = torch.tensor(pages, dtype=torch.int64)
        slots = (idx[:, None] * ps + torch.arange(ps)).flatten()
        self.req_to_token_pool.req_to_token[row, start:start + len(slots)] = slots

    def _row_pages(self, row: int, start: int, end: int) -> list[int]:
        """Page ids of the page-aligned token range [start, end) of a row."""
        ps = self.page_size
        return (self.req_to_token_pool.req_to_token[row, start:end:ps] // ps).tolist()

    # ---- caching into the tree ------------------------------------------------------------
    def cache_unfinished(self, req: Req) -> None:
        """After an extend: share the computed prefix through the tree and point the row at the
        tree's pages, so concurrent requests with the same prefix reuse it."""
        if self.tree.disable:
            return
        ps = self.page_size
        aligned = req.num_cached - req.num_cached % ps
        if aligned <= req.cache_protected_len:
            return
        key = req.fill_ids[:aligned]
        row = req.req_pool_idx
        pages = self._row_pages(row, 0, aligned)
        existing = self.tree.insert(key, pages)
        # Our pages in [protected, existing) duplicate the tree's: free them, use the tree's.
        dup = pages[req.cache_protected_len // ps:existing // ps]
        if dup:
            self.pool.free(dup)
        m = self.tree.match_prefix(key)
        self._write_pages(row, 0, m.page_indices)
        self.tree.lock(m.last_node)
        self.tree.unlock(req.last_node)
        req.last_node = m.last_node
        req.cache_protected_len = aligned

    def release(self, req: Req, insert: bool) -> None:
        """Free a finished, aborted or retracted request's KV and row.

        With ``insert`` (finished or aborted), the computed tokens (prompt + output whose KV
        exists) go into the tree first, so the next turn of a conversation reuses them.
        """
        if req.req_pool_idx is None:
            return
        ps = self.page_size
        row = req.req_pool_idx
        end_page = -(-req.num_cached // ps) * ps  # pages the request holds
        own_start = req.cache_protected_len
        if insert and not self.tree.disable:
            aligned = req.num_cached - req.num_cached % ps
            pages = self._row_pages(row, 0, aligned)
            existing = self.tree.insert(req.fill_ids[:aligned], pages)
            dup = pages[own_start // ps:existing // ps]
            if dup:
                self.pool.free(dup)
            own_start = max(own_start, aligned)
        tail = self._row_pages(row, own_start, end_page)
        if tail:
            self.pool.free(tail)
        self.tree.unlock(req.last_node)
        self.req_to_token_pool.free(row)
        req.req_pool_idx = None
        req.last_node = None

    # ---- checks ---------------------------------------------------------------------------
    def check_idle(self) -> None:
        """With no request holding KV: free + evictable == total, nothing protected, rows all free.

        Raises:
            RuntimeError: naming the leak.
        """
        self.tree.check_invariants()
        free, ev, prot = self.pool.available_size, self.tree.evictable_size(), self.tree.protected_size()
        if free + ev + prot != self.total_tokens or prot != 0:
            raise RuntimeError(f"KV cache memory leak detected: free {free} + evictable {ev} + protected "
                               f"{prot} != total {self.total_tokens}")
        if self.req_to_token_pool.available_size != self.req_to_token_pool.size:
            raise RuntimeError("req_to_token_pool memory leak detected: rows still held while idle")
        if self.tiers is not None:
            self.tiers.check_idle()

    def flush(self) -> None:
        """Drop the whole tree and the host tier (only call while no request holds KV); storage stays."""
        self.tree.reset()
        if self.tiers is not None:
            self.tiers.flush_host()
        self.pool.clear()
        self.req_to_token_pool.clear()
