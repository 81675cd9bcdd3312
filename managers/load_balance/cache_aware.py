"""``--load-balance-method cache_aware`` (the default): SGLang's router algorithm over token ids.

Per request, with ``loads`` = unfinished requests per replica:

1. *Imbalance guard*: if ``max(loads) - min(loads) > balance_abs_threshold`` and
   ``max(loads) > min(loads) * balance_rel_threshold``, the least loaded replica gets it, whatever
   the cache says (a hot prefix must not pile every request onto one replica).
2. Otherwise the approximate tree (``radix_cache.approx_tree``) gives, per replica, the longest
   prefix of the prompt routed there before. If the best match covers more than
   ``cache_threshold`` of the prompt, the replica holding it gets the request (ties: the less
   loaded, then the lower index).
3. Else the least loaded replica, ties going to the one whose tree is smallest (SGLang's router
   sends every miss to the smallest tree; we put load first, since a replica with a small tree
   but a long queue is the wrong place for a new prefix, and use the tree size to spread new
   prefixes when loads are equal, e.g. a burst of first requests).

The prompt is then recorded in the tree under the chosen replica; each replica's share of the tree
is pruned (least recently routed leaves first) to ``max_tree_size`` tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Optional

from radixlm.managers.load_balance.base import LoadBalancer, least_loaded
from radixlm.radix_cache.approx_tree import ApproxPrefixTree


@dataclasses.dataclass(frozen=True)
class CacheAwareConfig:
    """SGLang router's knobs (``--cache-threshold`` etc.; ``--router-*`` on our server).

    cache_threshold: fraction of the prompt (0..1) the best match must exceed to follow the cache.
    balance_abs_threshold: requests; with balance_rel_threshold, when loads count as imbalanced.
    balance_rel_threshold: ratio (>= 1).
    max_tree_size: tokens per replica in the approximate tree (None: unbounded until set).
    """

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    max_tree_size: Optional[int] = None


class CacheAware(LoadBalancer):
    name = "cache_aware"

    def __init__(self, num_replicas: int, config: CacheAwareConfig = CacheAwareConfig()) -> None:
        super().__init__(num_replicas)
        self.config = config
        self.tree = ApproxPrefixTree(config.max_tree_size)

    def set_max_tree_size(self, tokens: int) -> None:
        """Bound each replica's share of the tree (e.g. to its KV pool size, once known)."""
        self.tree.max_size = max(1, tokens)

    def imbalanced(self, loads: Sequence[int]) -> bool:
        hi, lo = max(loads), min(loads)
        c = self.config
        return hi - lo > c.balance_abs_threshold and hi > lo * c.balance_rel_threshold

    def select(self, input_ids: Sequence[int], loads: Sequence[int]) -> int:
        sizes = [self.tree.size(r) for r in range(self.num_replicas)]
        replica = None
        if not self.imbalanced(loads) and input_ids:
            matches = self.tree.match(input_ids)
            best = max(matches.values(), default=0)
            if best / len(input_ids) > self.config.cache_threshold:
                replica = min((loads[r], r) for r, n in matches.items() if n == best)[1]
        if replica is None:
            replica = least_loaded(loads, sizes)
        self.tree.insert(input_ids, replica)
        return replica

    def record(self, input_ids: Sequence[int], replica: int) -> None:
        self.tree.insert(input_ids, replica)

    def on_flush(self, replica: int) -> None:
        self.tree.remove_tenant(replica)
