"""The request router of the ``radixlm`` deployment: Ray Serve's ``PrefixCacheAffinityRouter`` for
requests with a prompt, power-of-two choices on queue length for the rest. Imports Ray (only
``app.build_app`` imports this module).

Ray's router matches the ``prompt`` of the call's argument (``ProxyRequest.prompt``, the routing key)
against a character prefix tree per replica: with queue lengths within ``imbalanced_threshold`` it
picks the longest match (below a 10% match, the replica with the smallest tree), else power of two.
Requests without a prompt (``/health``, ``/get_server_info``, a body that is not JSON) have the key
``""``, which Ray's router cannot take (it divides by the prompt's length): they get its fallback,
power of two choices, directly, and are not inserted into the tree.

``PrefixCacheAffinityRouter``'s public module, ``ray.serve.llm.request_router``, imports Ray's whole
LLM stack (``ray[llm]``: pyarrow and more) through ``ray.serve.llm``; the class it re-exports
unchanged lives in a module that needs only Ray Serve, used when the public import fails.
"""

from __future__ import annotations

from typing import Any, List, Optional

try:
    from ray.serve.llm.request_router import PrefixCacheAffinityRouter
except ImportError:
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
        PrefixCacheAffinityRouter,
    )


def _prompt(pending_request: Any) -> str:
    args = getattr(pending_request, "args", None) or ()
    prompt = getattr(args[0], "prompt", "") if args else ""
    return prompt if isinstance(prompt, str) else ""


class PromptAffinityRouter(PrefixCacheAffinityRouter):
    """``PrefixCacheAffinityRouter`` with requests that have no prompt routed by load alone."""

    async def choose_replicas(self, candidate_replicas: List[Any], pending_request: Optional[Any] = None
                              ) -> List[List[Any]]:
        if pending_request is not None and not _prompt(pending_request):
            pending_request = None  # Ray's router then returns its power-of-two choice
        return await super().choose_replicas(candidate_replicas, pending_request)

    def on_request_routed(self, pending_request: Any, replica_id: Any, result: Any) -> None:
        if pending_request is not None and _prompt(pending_request):
            super().on_request_routed(pending_request, replica_id, result)
