"""N-gram drafting (SGLang's ``--speculative-algorithm NGRAM``, vLLM's prompt lookup): guess the next
tokens of a request from text it has already seen, at no model cost.

Two sources, tried in order:

1. The radix tree (``RadixCache.continuation``): when the tree holds the request's whole context
   followed by more tokens, some earlier request produced that continuation after the same text.
2. The request's own prompt + output (``NgramIndex``): the longest suffix of the sequence, between
   ``--speculative-ngram-min-match-window-size`` and ``--speculative-ngram-max-match-window-size``
   tokens, that occurred earlier; the draft is what followed its latest earlier occurrence.

``DraftBudget`` adapts each request's draft length to its recent acceptance and stops drafting for a
while when verify steps keep accepting nothing, so text that cannot be predicted this way costs
(almost) nothing over plain decoding.

Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from radixlm.radix_cache import RadixCache

# Back-off: after this many verify steps in a row accepting no draft, drafting pauses for
# COOLDOWN_BASE steps, doubling with every further miss up to COOLDOWN_MAX decode steps.
MISS_LIMIT = 2
COOLDOWN_BASE = 4
COOLDOWN_MAX = 64


class NgramIndex:
    """The latest occurrence of every n-gram (``min_n`` <= n <= ``max_n`` tokens) of a growing
    sequence that has a continuation, i.e. does not end at the sequence's last token.

    Keys are the n-grams' hashes (an int per entry, not a tuple; a lookup re-checks the tokens, so a
    collision only loses a draft). Memory: (max_n - min_n + 1) * len(seq) dict entries; ``update``
    costs max_n - min_n + 1 hashes per new token.
    """

    def __init__(self, min_n: int, max_n: int):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self._tables: list[dict[int, int]] = [{} for _ in range(max_n - min_n + 1)]
        self._done = 0  # n-grams ending at positions <= _done are indexed (end exclusive)

    def update(self, seq: Sequence[int]) -> None:
        """Index the n-grams of ``seq`` that end before its last token. ``seq`` must extend the
        sequence of earlier calls (tokens are only ever appended)."""
        lo, hi, tables = self.min_n, self.max_n, self._tables
        for end in range(self._done + 1, len(seq)):
            for n in range(lo, min(hi, end) + 1):
                tables[n - lo][hash(tuple(seq[end - n:end]))] = end
        self._done = max(self._done, len(seq) - 1)

    def lookup(self, seq: Sequence[int], max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` tokens that followed the latest earlier occurrence of the longest
        indexed suffix of ``seq`` ([] if no suffix of at least ``min_n`` tokens occurred before).
        Call ``update(seq)`` first."""
        if max_tokens <= 0:
            return []
        for n in range(min(self.max_n, len(seq) - 1), self.min_n - 1, -1):
            suffix = tuple(seq[len(seq) - n:])
            end = self._tables[n - self.min_n].get(hash(suffix))
            if end is not None and tuple(seq[end - n:end]) == suffix:  # not a hash collision
                return list(seq[end:end + max_tokens])
        return []


class DraftBudget:
    """How many tokens a request may draft next, from how its verify steps went.

    Starts at ``max_tokens``; a fully accepted draft doubles the length (up to ``max_tokens``), a
    partly accepted one sets it to accepted + 1, a rejected one halves it and counts a miss;
    ``MISS_LIMIT`` misses in a row pause drafting (see the module constants).
    """

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.length = max_tokens
        self.misses = 0
        self.cooldown = 0

    def allowed(self) -> int:
        """Draft length for this step (0 while paused; each call is one decode step)."""
        if self.cooldown > 0:
            self.cooldown -= 1
            return 0
        return self.length

    def record(self, drafted: int, accepted: int) -> None:
        """One verify step drafted ``drafted`` >= 1 tokens, of which ``accepted`` were accepted."""
        if accepted == 0:
            self.misses += 1
            self.length = max(1, self.length // 2)
            if self.misses >= MISS_LIMIT:
                self.cooldown = min(COOLDOWN_BASE << (self.misses - MISS_LIMIT), COOLDOWN_MAX)
            return
        self.misses = 0
        self.length = min(self.max_tokens, 2 * self.length if accepted == drafted else accepted + 1)


class NgramState:
    """One request's drafter state (kept on ``Req.spec_state``)."""

    def __init__(self, min_n: int, max_n: int, max_tokens: int):
        self.index = NgramIndex(min_n, max_n)
        self.budget = DraftBudget(max_tokens)


class NgramDrafter:
    """Proposes drafts for requests from the radix tree and their own text.

    Args:
        tree: the scheduler's radix cache (read through ``continuation`` only).
        num_draft_tokens: ``--speculative-num-draft-tokens``; drafts hold at most N - 1 tokens.
        min_window, max_window: the suffix lengths (tokens) matched in a request's own text.
    """

    def __init__(self, tree: RadixCache, num_draft_tokens: int, min_window: int, max_window: int):
        self.tree = tree
        self.max_draft = num_draft_tokens - 1
        self.min_window, self.max_window = min_window, max_window

    def new_state(self) -> NgramState:
        return NgramState(self.min_window, self.max_window, self.max_draft)

    def propose(self, state: NgramState, seq: list[int], limit: int) -> list[int]:
        """A draft continuing ``seq`` (the request's prompt + output), at most
        ``min(limit, the budget's length)`` tokens; [] while the budget pauses drafting."""
        k = min(limit, state.budget.allowed())
        if k <= 0:
            return []
        draft = self.tree.continuation(seq, k)
        if draft:
            return draft
        state.index.update(seq)
        return state.index.lookup(seq, k)
