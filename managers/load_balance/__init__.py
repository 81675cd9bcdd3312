"""Data-parallel routing policies (``--load-balance-method``): pure Python, no torch.

``create_load_balancer(method, num_replicas, config)`` builds one by name from ``LOAD_BALANCERS``.
"""

from __future__ import annotations

from radixlm.managers.load_balance.base import LoadBalancer, least_loaded
from radixlm.managers.load_balance.cache_aware import CacheAware, CacheAwareConfig
from radixlm.managers.load_balance.round_robin import RoundRobin
from radixlm.managers.load_balance.shortest_queue import ShortestQueue

LOAD_BALANCERS = {"cache_aware": CacheAware, "round_robin": RoundRobin, "shortest_queue": ShortestQueue}

__all__ = ["LOAD_BALANCERS", "CacheAware", "CacheAwareConfig", "LoadBalancer", "RoundRobin", "ShortestQueue",
           "create_load_balancer", "least_loaded"]


def create_load_balancer(method: str, num_replicas: int, config: CacheAwareConfig = CacheAwareConfig()
                         ) -> LoadBalancer:
    """Raises ValueError for an unknown method."""
    cls = LOAD_BALANCERS.get(method)
    if cls is None:
        raise ValueError(f"unknown load balance method {method!r}; choose from {', '.join(LOAD_BALANCERS)}")
    return CacheAware(num_replicas, config) if cls is CacheAware else cls(num_replicas)
