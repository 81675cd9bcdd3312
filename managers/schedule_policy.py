"""Waiting-queue ordering and extend-batch admission (SGLang's ``schedule_policy.py``).

Policies: ``lpm`` (longest cached prefix first; falls back to fcfs past 128 waiting requests, where
sorting costs more than it saves) and ``fcfs``. ``PrefillAdder`` admits requests while the KV pool
can hold their new tokens plus a reservation for the decode tokens of every running request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from radixlm.managers.kv_manager import KVManager
from radixlm.managers.schedule_batch import Req

LPM_MAX_QUEUE = 128
# In-batch prefix dedup (SGLang): a request whose cached prefix is short but whose first tokens equal
# those of a request already in this extend batch waits one round, then hits the cache instead of
# computing the same prefix twice.
IN_BATCH_PREFIX_TOKENS = 32
CLIP_MAX_NEW_TOKENS_ESTIMATION = 4096


def order_waiting(waiting: list[Req], policy: str, kv: KVManager) -> list[Req]:
    """Return the queue in admission order. Retracted requests (already started) keep priority."""
    if policy == "fcfs" or len(waiting) > LPM_MAX_QUEUE or kv.tree.disable:
        return waiting
    prefix = {id(r): kv.peek_prefix_len(r) for r in waiting}
    # sorted() is stable: equal prefixes keep arrival order.
    return sorted(waiting, key=lambda r: (r.num_retractions == 0, -prefix[id(r)]))


def decode_reservation(req: Req, new_token_ratio: float) -> int:
    """Tokens to keep free for a request's future decode steps."""
    remaining = max(req.max_new_tokens - len(req.output_ids), 0)
    return int(min(remaining, CLIP_MAX_NEW_TOKENS_ESTIMATION) * new_token_ratio)


@dataclass
class PrefillAdder:
    """Budgets of one extend batch.

    ``reserved``: decode tokens promised to running and admitted requests.
    ``rem_input_tokens``: extend tokens still allowed in this batch (``--max-prefill-tokens``).
    ``rem_chunk_tokens``: tokens one request may extend by (``--chunked-prefill-size``; None = no limit).
    """

    kv: KVManager
    new_token_ratio: float
    rem_input_tokens: int
    rem_chunk_tokens: Optional[int]
    reserved: int = 0
    admitted: list[Req] = field(default_factory=list)
    new_chunked_req: Optional[Req] = None
    batch_prefixes: set[tuple[int, ...]] = field(default_factory=set)

    def defer_for_shared_prefix(self, req: Req) -> bool:
        """True if ``req`` should wait because a request in this batch is computing its prefix."""
        n = IN_BATCH_PREFIX_TOKENS
        if req.num_cached >= n or req.seq_len <= n or self.kv.tree.disable:
            return False
        head = tuple(req.origin_input_ids[:n])
        if head in self.batch_prefixes:
            return True
        self.batch_prefixes.add(head)
        return False

    def reserve_running(self, running: list[Req]) -> None:
        self.reserved += sum(decode_reservation(r, self.new_token_ratio) for r in running)

    def extend_size(self, req: Req) -> Optional[int]:
        """Tokens ``req`` would extend by now (chunked if needed), or None if it cannot be added."""
        want = req.seq_len - req.num_cached
        limit = self.rem_input_tokens
        if self.rem_chunk_tokens is not None:
            limit = min(limit, self.rem_chunk_tokens)
        if want <= limit:
            return want
        if not self.admitted and self.rem_chunk_tokens is None:
            return want  # chunking off: a long prompt runs alone
        # Cut at a page boundary so the chunk's KV can be shared through the tree; when the
        # chunk budget is below one page, an unaligned chunk still makes progress.
        if limit <= 0:
            return None
        ps = self.kv.page_size
        end = (req.num_cached + limit) // ps * ps
        return end - req.num_cached if end > req.num_cached else limit

    def fits(self, req: Req, size: int) -> bool:
        ps = self.kv.page_size
        need = self.kv.pages_needed(req, size) * ps
        reserve = decode_reservation(req, self.new_token_ratio) if size == req.seq_len - req.num_cached else 0
        # A request's max_new_tokens fits the pool beside its prompt: alone, it is always admitted. The
        # room beside it is the pool less all of the prompt's pages: those its cached prefix or earlier
        # chunks already hold (locked, so not counted as available) and the ones this extend needs.
        held = -(-req.num_cached // ps) * ps
        reserve = min(reserve, max(self.kv.total_tokens - held - need, 0))
        return self.kv.available_tokens() - self.reserved >= need + reserve

    def add(self, req: Req, size: int) -> None:
        req.extend_len = size
        self.admitted.append(req)
        self.rem_input_tokens -= size
        if size < req.seq_len - req.num_cached:
            self.new_chunked_req = req
        else:
            self.reserved += decode_reservation(req, self.new_token_ratio)
