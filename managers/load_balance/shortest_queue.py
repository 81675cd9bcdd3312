"""``--load-balance-method shortest_queue``: the replica with the fewest unfinished requests
(SGLang's DP controller method of that name); ties go to the lowest index."""

from __future__ import annotations

from collections.abc import Sequence

from radixlm.managers.load_balance.base import LoadBalancer, least_loaded


class ShortestQueue(LoadBalancer):
    name = "shortest_queue"

    def select(self, input_ids: Sequence[int], loads: Sequence[int]) -> int:
        return least_loaded(loads)
