"""The HTTP ingress of a ``radixlm serve-ray`` application (Ray is not imported here).

Ray Serve's HTTP proxy hands every request on the application's route prefix (``/``) to
``RadixlmIngress.__call__`` as a Starlette ``Request``. The ingress reads the body, computes the
routing key (``routing_key.py``) and calls the ``radixlm`` deployment through its handle with a
``ProxyRequest``. The handle's request router — Ray Serve's ``PrefixCacheAffinityRouter`` — picks
the replica from that key and the replicas' queue lengths; the replica forwards the request to its
radixlm server and streams back a ``ProxyHead`` then the body, which becomes the HTTP answer
unchanged: ``/generate``, ``/v1/*`` (SSE streams included), the health and info routes.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from radixlm.srt.ray_serve.replica import ProxyHead, ProxyRequest
from radixlm.srt.ray_serve.routing_key import routing_key


class RadixlmIngress:
    """Args: ``backend``: a Serve ``DeploymentHandle`` of the ``RadixlmReplica`` deployment."""

    def __init__(self, backend: Any):
        self.backend = backend.options(stream=True)

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import StreamingResponse

        body = await request.body()
        path = request.url.path
        proxied = ProxyRequest(method=request.method, path=path, query=request.url.query,
                               headers=[(k, v) for k, v in request.headers.items()], body=body,
                               prompt=routing_key(path, body))
        chunks = self.backend.forward.remote(proxied)
        head = await chunks.__anext__()
        if not isinstance(head, ProxyHead):
            raise RuntimeError(f"the replica answered {type(head).__name__} before its status line")
        return StreamingResponse(_body(chunks), status_code=head.status, headers=dict(head.headers))


async def _body(chunks: Any) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield chunk
