"""Shared-prefix groups of a batch, for cascade attention (FlashInfer's
``MultiLevelCascadeAttentionWrapper``; Hydragen, Juravsky et al. 2024).

Requests that hit the same radix-cache prefix have ``req_to_token`` rows that start with the same KV
slots. A backend that finds them can read that prefix's K/V once for the whole group instead of once
per request — on a memory-bound CPU that is most of a shared-prefix decode step's traffic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.srt.forward_batch import ForwardBatch


def shared_prefix_groups(fb: "ForwardBatch", min_prefix: int, align: int = 1) -> list[tuple[int, list[int]]]:
    """Partition the batch's requests into ``(P, request indices)`` groups.

    A group with P > 0 has at least two requests whose first P KV slots are identical, with
    ``min_prefix <= P <= min(prefix_lens)`` (so no query row falls inside the shared part) and P a
    multiple of ``align``; the requests that share nothing come last as one group with P = 0.
    Indices are batch positions (ints, ascending within a group).
    """
    bs = fb.batch_size
    eligible = [i for i in range(bs) if fb.prefix_lens[i] >= min_prefix]
    if len(eligible) < 2:
        return [(0, list(range(bs)))]
    table = fb.req_to_token_pool.req_to_token
    rows = fb.req_pool_indices
    first = table[:, 0].index_select(0, rows).tolist()
    by_first: dict[int, list[int]] = {}
    for i in eligible:
        by_first.setdefault(first[i], []).append(i)
    groups, rest = [], [i for i in range(bs) if fb.prefix_lens[i] < min_prefix]
    for members in by_first.values():
        limit = min(fb.prefix_lens[i] for i in members)
        if len(members) > 1:
            idx = torch.tensor(members, dtype=torch.int64, device=rows.device)
            block = table[:, :limit].index_select(0, rows.index_select(0, idx))
            differs = (block != block[:1]).any(0).nonzero()
            shared = int(differs[0]) if differs.numel() else limit
            shared -= shared % align
            if shared >= min_prefix:
                groups.append((shared, members))
                continue
        rest += members
    if rest:
        groups.append((0, sorted(rest)))
    return groups
