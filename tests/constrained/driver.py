"""A fake logits source and a decode loop that drives a ``GrammarMatcher`` like the scheduler does.

Logits are seeded random noise plus a per-token bias that favours short tokens, tokens that close
something (``"``, ``}``, ``]``, ``)``, ``,``) and EOS, so constrained outputs stay short and
finish fast.
Each step: fill the row's bitmask (with the tokens left when a budget is given, as the scheduler
does) -> mask the logits -> greedy argmax or a seeded sample -> ``accept_token``; stop when the
matcher is terminated (a stop token was accepted).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Optional

import torch

from radixlm.constrained import GrammarMatcher, allocate_bitmask
from radixlm.constrained.base import bitmask_to_bool

_CLOSERS = (b'"', b"}", b"]", b")", b",")


def token_bias(table: list[Optional[bytes]], eos_ids: tuple[int, ...], vocab_size: int,
               closer_boost: float = 2.0, eos_boost: float = 6.0) -> torch.Tensor:
    """(V,) float32: -0.4 per byte of the token, + ``closer_boost`` if it closes something."""
    bias = torch.zeros(vocab_size, dtype=torch.float32)
    for tid, raw in enumerate(table[:vocab_size]):
        if raw:
            bias[tid] = -0.4 * len(raw) + (closer_boost if any(c in raw for c in _CLOSERS) else 0.0)
    for e in eos_ids:
        bias[e] = eos_boost
    return bias


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Run torch ops on one thread: per-step ops on a (1, 49k) row are tiny, and intra-op threads
    spin-waiting on a loaded CI machine made the loop ~10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class Generation:
    ids: list[int]  # accepted tokens, the final stop token included when terminated
    terminated: bool
    allowed_after: list[int]  # tokens the mask allows after the last step

    @property
    def body(self) -> list[int]:
        """The output without its final stop token."""
        return self.ids[:-1] if self.terminated else self.ids


def generate(matcher: GrammarMatcher, vocab_size: int, bias: torch.Tensor, seed: int,
             sample: bool = False, temperature: float = 0.6, max_steps: int = 256,
             budget: Optional[int] = None) -> Generation:
    """Decode under ``matcher`` until terminated or ``max_steps``; every token must be accepted.

    ``budget``: like ``max_new_tokens`` (at most that many steps, and the matcher is told the
    tokens left each step, so a JSON grammar closes in time); None: no budget.
    """
    if budget is not None:
        max_steps = min(max_steps, budget)
    with single_thread():
        return _generate(matcher, vocab_size, bias, seed, sample, temperature, max_steps, budget)


def _generate(matcher: GrammarMatcher, vocab_size: int, bias: torch.Tensor, seed: int,
              sample: bool, temperature: float, max_steps: int,
              budget: Optional[int]) -> Generation:
    gen = torch.Generator().manual_seed(seed)
    bitmask = allocate_bitmask(1, vocab_size)
    ids: list[int] = []
    for _ in range(max_steps):
        matcher.fill_bitmask(bitmask, 0, None if budget is None else budget - len(ids))
        logits = torch.randn(1, vocab_size, generator=gen) + bias
        # Same layout as kernels.sampling.apply_vocab_mask (checked in test_bitmask.py), faster.
        logits.masked_fill_(~bitmask_to_bool(bitmask, vocab_size), float("-inf"))
        if sample:
            probs = torch.softmax(logits / temperature, dim=-1)
            tid = int(torch.multinomial(probs, 1, generator=gen))
        else:
            tid = int(torch.argmax(logits))
        assert matcher.accept_token(tid), f"masked-in token {tid} rejected after {ids}"
        ids.append(tid)
        if matcher.is_terminated():
            break
    matcher.fill_bitmask(bitmask, 0)
    allowed = bitmask_to_bool(bitmask, vocab_size)[0].nonzero().flatten().tolist()
    return Generation(ids, matcher.is_terminated(), allowed)
