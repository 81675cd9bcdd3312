"""The acceptance rule of speculative decoding for deterministic (point-mass) drafts.

A verify forward yields logits at positions ``0..k`` of a request whose draft is ``d_0..d_{k-1}``:
position ``j`` predicts the token after ``d_{j-1}`` (position 0: after the last accepted token).
Each position's logits are processed exactly as the non-speculative path would process them at that
step (penalties over the output so far *including* ``d_0..d_{j-1}``, min_new_tokens, grammar mask,
logit_bias, temperature, top-k/top-p/min-p, the row's ``sampling_seed`` stream at that step) and one
target token ``t_j`` is drawn from each. Drafts are accepted while ``d_j == t_j``; the first target
that differs (or ``t_k`` after a fully accepted draft) is the bonus token.

That is the standard rule (Leviathan et al. 2023; Chen et al. 2023) for a draft distribution that
puts all mass on ``d_j``: ``d_j`` is accepted with probability ``p_j(d_j)``, and on rejection the
token is drawn from the residual ``max(p_j - q_j, 0)`` renormalised, which is ``p_j`` with ``d_j``
removed — exactly the law of ``t_j`` given ``t_j != d_j``. So every emitted token has the target
distribution, greedy output equals argmax decoding token for token, and a seeded request draws the
same tokens as without speculation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch

from radixlm.kernels.gpu_sampling import sample
from radixlm.kernels.sampling import SamplingBatchInfo, apply_logits_processors


def accept_length(draft: Sequence[int], targets: Sequence[int]) -> int:
    """How many leading draft tokens equal their targets.

    Raises:
        ValueError: ``len(targets) != len(draft) + 1``.
    """
    if len(targets) != len(draft) + 1:
        raise ValueError(f"need one target per draft token plus one, got {len(targets)} for {len(draft)}")
    n = 0
    while n < len(draft) and draft[n] == targets[n]:
        n += 1
    return n


def verified_tokens(draft: Sequence[int], targets: Sequence[int]) -> list[int]:
    """The tokens a verify step emits: the accepted drafts, then one bonus target token."""
    n = accept_length(draft, targets)
    return list(draft[:n]) + [int(targets[n])]


def sample_targets(logits: torch.Tensor, info: SamplingBatchInfo,
                   vocab_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One target token per verify row.

    Args:
        logits: (R, V) float32 raw logits, one row per verify position; modified in place.
        info: R rows of sampling state, row ``j`` of a request built from its output + ``d_0..d_{j-1}``.
        vocab_mask: optional packed grammar bitmask (R, ceil(V/32)) of the matcher state at each row.
    Returns:
        (R,) int64 target tokens on the logits' device.
    """
    return sample(apply_logits_processors(logits, info, vocab_mask), info)
