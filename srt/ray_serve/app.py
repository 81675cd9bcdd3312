"""The Ray Serve application of ``radixlm serve-ray``: N radixlm replicas behind one HTTP ingress.

::

    HTTP -> Serve proxy -> RadixlmIngress (1 replica, 0 CPUs)
              handle.forward(ProxyRequest) -- PrefixCacheAffinityRouter --> radixlm replica 1..N
                                                                            (RadixlmReplica: radixlm serve)

The router is Ray Serve's own ``PrefixCacheAffinityRouter`` (``router.py``): it keeps a character
prefix tree of the prompts sent to each replica (in a detached Ray actor shared by the routers) and,
while the replicas' queue lengths differ by at most ``imbalanced_threshold``, sends a request to the
replica with the longest matching prefix (below a 10% match, to the replica with the smallest tree);
under imbalance it falls back to power-of-two-choices on queue length. It reads the ``prompt``
attribute of the call's argument, which ``ProxyRequest`` carries, so it needs nothing of Ray's vLLM
stack.
"""

from __future__ import annotations

import dataclasses
from typing import Any

REPLICA_DEPLOYMENT = "radixlm"
# The router's prefix tree lives in this detached actor (Ray's name, in the namespace
# "serve::<app>::<deployment>"); ``serve_ray`` removes it at exit so a long-lived cluster does not keep
# the trees of a finished deployment (serve.shutdown removes it too).
PREFIX_TREE_ACTOR = "LlmPrefixTreeActor"


@dataclasses.dataclass(frozen=True)
class RayServeOptions:
    """How the replicas are placed. ``max_ongoing_requests``: per replica, Serve's admission cap (the
    radixlm server queues what it cannot run yet); ``imbalanced_threshold``: queue-length difference
    beyond which the router prefers load over prefix affinity."""

    num_replicas: int = 1
    num_cpus_per_replica: float = 1.0
    num_gpus_per_replica: float = 0.0
    max_ongoing_requests: int = 256
    imbalanced_threshold: int = 10


def build_app(server_argv: list[str], options: RayServeOptions) -> Any:
    """The bound Serve application (``serve.run`` it). ``server_argv``: each replica's
    ``radixlm serve`` flags, without ``--host`` / ``--port``."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from radixlm.srt.ray_serve.ingress import RadixlmIngress
    from radixlm.srt.ray_serve.replica import RadixlmReplica
    from radixlm.srt.ray_serve.router import PromptAffinityRouter

    replica = serve.deployment(
        RadixlmReplica, name=REPLICA_DEPLOYMENT, num_replicas=options.num_replicas,
        ray_actor_options={"num_cpus": options.num_cpus_per_replica, "num_gpus": options.num_gpus_per_replica},
        max_ongoing_requests=options.max_ongoing_requests,
        health_check_period_s=10, health_check_timeout_s=30, graceful_shutdown_timeout_s=20,
        request_router_config=RequestRouterConfig(
            request_router_class=PromptAffinityRouter,
            # Eviction keeps the prefix trees bounded (Ray's default thresholds: 400k characters).
            request_router_kwargs={"imbalanced_threshold": options.imbalanced_threshold, "do_eviction": True}))
    # The ingress only moves bytes: no CPU reservation, so the replicas get the node's cores.
    ingress = serve.deployment(RadixlmIngress, name="ingress", num_replicas=1, ray_actor_options={"num_cpus": 0},
                               max_ongoing_requests=max(1000, options.num_replicas * options.max_ongoing_requests))
    return ingress.bind(replica.bind(server_argv))
