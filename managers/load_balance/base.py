"""The interface of a data-parallel routing policy: pick the replica for one request.

A policy sees the request's prompt token ids and each replica's load (requests routed to it and not
yet finished, kept by ``DataParallelController``) and returns a replica index. It keeps whatever
state it needs (the cache-aware policy: its approximate tree) and is told when a replica's cache was
flushed. Pure Python, no sockets, no torch: tests drive it with plain lists.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence


class LoadBalancer(ABC):
    """Args: num_replicas (>= 1)."""

    name: str = ""

    def __init__(self, num_replicas: int) -> None:
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        self.num_replicas = num_replicas

    @abstractmethod
    def select(self, input_ids: Sequence[int], loads: Sequence[int]) -> int:
        """The replica (0 .. num_replicas - 1) for a request with prompt ``input_ids``, given
        ``loads[i]`` = unfinished requests on replica ``i``. Called once per routed request."""

    def record(self, input_ids: Sequence[int], replica: int) -> None:
        """A request was sent to ``replica`` without ``select`` (pinned by ``data_parallel_rank``,
        or an n > 1 copy following its prefill): keep the policy's view of the caches right."""

    def on_flush(self, replica: int) -> None:
        """``replica``'s prefix cache was emptied (``/flush_cache``)."""


def least_loaded(loads: Sequence[int], tie_break: Sequence[int] = ()) -> int:
    """Index of the smallest load; ties go to the smallest ``tie_break`` value, then the lowest index."""
    keys = [(load, tie_break[i] if tie_break else 0, i) for i, load in enumerate(loads)]
    return min(keys)[2]
