"""``--load-balance-method round_robin``: replicas in turn, whatever the prompt or the load."""

from __future__ import annotations

from collections.abc import Sequence

from radixlm.managers.load_balance.base import LoadBalancer


class RoundRobin(LoadBalancer):
    name = "round_robin"

    def __init__(self, num_replicas: int) -> None:
        super().__init__(num_replicas)
        self._next = 0

    def select(self, input_ids: Sequence[int], loads: Sequence[int]) -> int:
        replica = self._next
        self._next = (self._next + 1) % self.num_replicas
        return replica
