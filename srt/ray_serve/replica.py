"""One radixlm replica inside a Ray Serve deployment replica (an actor): a full ``radixlm serve``.

The actor starts ``python -m radixlm.srt.launch_server`` with the deployment's server flags on a free
loopback port of its own node, waits for ``/health``, and then forwards each ``ProxyRequest`` to it
over HTTP, streaming the answer back as it comes: first a ``ProxyHead`` (status, headers), then the
body's bytes chunk by chunk (SSE streams included). Every route, validation rule and error shape is
therefore the plain server's. The server's output goes to the actor's stdout (Ray sends it to the
driver's log, prefixed with the replica); its last lines are kept for error messages.

The server process dies with the actor (``PR_SET_PDEATHSIG`` on Linux, and ``__del__``, which Serve
calls on a graceful replica shutdown, stops it with SIGTERM). ``check_health`` — Serve's replica
health check — fails when the server has exited or ``/health`` does not answer 200, so Serve
replaces the replica. Ray is not imported here: the class becomes a deployment in ``app.py``.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, AsyncIterator, Optional

import httpx

from radixlm.srt.health_wait import wait_healthy

START_TIMEOUT_S = 600.0  # a first start may convert a GGUF and compile the CPU kernels
STOP_TIMEOUT_S = 15.0
HEALTH_TIMEOUT_S = 10.0
_TAIL_LINES = 40
# Hop-by-hop headers (RFC 9110 section 7.6.1) and the ones the ingress's server sets itself.
_DROPPED_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
                    "content-length", "host", "date", "server"}
REPLICA_HEADER = "x-radixlm-replica"  # names the replica that answered (for clients, tests, debugging)


@dataclasses.dataclass(frozen=True)
class ProxyRequest:
    """One HTTP request as the ingress received it.

    ``prompt`` is the routing key (``routing_key.routing_key``): Ray Serve's
    ``PrefixCacheAffinityRouter`` reads a ``prompt`` attribute of the call's argument."""

    method: str
    path: str  # with the leading "/", no query
    query: str  # the raw query string, "" if none
    headers: list[tuple[str, str]]
    body: bytes
    prompt: str


@dataclasses.dataclass(frozen=True)
class ProxyHead:
    """The first item of a forwarded answer: the server's status and headers, and who answered."""

    status: int
    headers: list[tuple[str, str]]
    replica: str


def forwardable_headers(headers: Any) -> list[tuple[str, str]]:
    """``(name, value)`` pairs of ``headers`` without hop-by-hop ones (lower-case names)."""
    return [(k.lower(), v) for k, v in headers.items() if k.lower() not in _DROPPED_HEADERS]


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: __del__ still stops it on a graceful shutdown


class RadixlmReplica:
    """A radixlm server process owned by this object.

    Args:
        server_argv: ``radixlm serve`` flags (no ``--host`` / ``--port``: the replica picks them).
        replica_name: reported in ``ProxyHead.replica`` and the ``x-radixlm-replica`` header; default:
            Serve's replica id when running in Serve, else the server's port.

    Raises:
        RuntimeError: the server exited during startup or was not healthy after ``START_TIMEOUT_S``
            (the message has the end of its log).
    """

    def __init__(self, server_argv: list[str], replica_name: Optional[str] = None):
        self.port = free_loopback_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "radixlm.srt.launch_server", *server_argv, "--host", "127.0.0.1",
             "--port", str(self.port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        threading.Thread(target=self._pump_log, name="radixlm-replica-log", daemon=True).start()
        self.name = replica_name or _serve_replica_id() or f"127.0.0.1:{self.port}"
        self._wait_healthy()
        self.client = httpx.AsyncClient(base_url=self.url, timeout=None)

    def _pump_log(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace")
            self._tail.append(line)
            sys.stdout.write(line)
            sys.stdout.flush()

    def log_tail(self) -> str:
        return "".join(self._tail)

    def _wait_healthy(self) -> None:
        outcome = wait_healthy(self.url, self.proc, START_TIMEOUT_S)
        if outcome == "healthy":
            return
        if outcome == "exited":
            time.sleep(0.2)  # let the log pump read the last lines
            raise RuntimeError(f"the radixlm server exited during startup (exit code {self.proc.returncode}):\n"
                               f"{self.log_tail()}")
        self.stop()
        raise RuntimeError(f"the radixlm server was not healthy after {START_TIMEOUT_S:.0f} s:\n{self.log_tail()}")

    async def forward(self, request: ProxyRequest) -> AsyncIterator[Any]:
        """Send ``request`` to the server; yields a ``ProxyHead``, then the body as ``bytes`` chunks."""
        url = request.path + (f"?{request.query}" if request.query else "")
        headers = [(k, v) for k, v in request.headers if k.lower() not in _DROPPED_HEADERS]
        async with self.client.stream(request.method, url, headers=headers, content=request.body) as resp:
            yield ProxyHead(resp.status_code, [*forwardable_headers(resp.headers), (REPLICA_HEADER, self.name)],
                            self.name)
            async for chunk in resp.aiter_raw():
                yield chunk

    async def check_health(self) -> None:
        """Serve's health check: raises when the server is gone or not answering ``/health`` with 200."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"the radixlm server exited (exit code {self.proc.returncode}):\n{self.log_tail()}")
        resp = await self.client.get("/health", timeout=HEALTH_TIMEOUT_S)
        if resp.status_code != 200:
            raise RuntimeError(f"the radixlm server's /health answered {resp.status_code}")

    def stop(self) -> None:
        """SIGTERM the server (its own shutdown stops its children), SIGKILL after ``STOP_TIMEOUT_S``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def __del__(self) -> None:
        if getattr(self, "proc", None) is not None:
            self.stop()


def _serve_replica_id() -> Optional[str]:
    """This Serve replica's id, when running inside one (Ray is imported only then)."""
    if "ray" not in sys.modules:
        return None
    try:
        from ray import serve

        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # noqa: BLE001 - not in a replica (e.g. a test drives the class directly)
        return None
