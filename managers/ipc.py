"""ZMQ PUSH/PULL helpers for the process seams (DESIGN.md section 2).

Every frame is one ``io_struct`` message as tagged msgpack (``io_struct.encode``/``decode``); an
unknown tag raises ``msgspec.ValidationError`` and malformed bytes raise ``msgspec.DecodeError``.
No pickle anywhere. Endpoints are ``ipc://`` paths in a per-launch temp directory (``IpcPaths``).

High-water marks are 0 (unbounded queues), as in SGLang: a slow consumer must never block the
scheduler's step. Every socket closes with linger 0, so shutdown never hangs on unsent frames.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import tempfile
from typing import Callable, Optional

import zmq
import zmq.asyncio

from radixlm.managers.io_struct import Message, decode, encode

logger = logging.getLogger(__name__)

# sun_path of a Unix socket is 108 bytes on Linux (104 on macOS), NUL included.
_MAX_IPC_PATH_BYTES = 100


@dataclasses.dataclass(frozen=True)
class IpcPaths:
    """The ``ipc://`` endpoints of one launch.

    scheduler_input: TokenizerManager PUSH -> Scheduler (rank 0) PULL, bound by the scheduler.
    detokenizer_input: Scheduler PUSH -> Detokenizer PULL, bound by the detokenizer.
    tokenizer_input: Detokenizer PUSH -> TokenizerManager PULL, bound by the tokenizer manager.
    scheduler_rpc: control replies (Scheduler -> TokenizerManager), bound by the tokenizer manager.
    root: the directory holding the socket files (removed by ``remove()``).
    launch_root: the launch's directory when this is one data-parallel replica's view
        (``for_dp_rank``), so ``remove()`` removes the whole launch; None otherwise.

    With ``--dp-size N`` each replica has its own ``scheduler_input`` and ``scheduler_rpc`` (and TP
    rendezvous file) in ``<root>/dp<k>/``; all replicas share the one detokenizer's sockets.
    """

    scheduler_input: str
    detokenizer_input: str
    tokenizer_input: str
    scheduler_rpc: str
    root: str
    launch_root: Optional[str] = None

    @classmethod
    def in_dir(cls, root: str) -> "IpcPaths":
        """Endpoints as socket files inside an existing directory ``root``.

        Raises:
            ValueError: a socket path would exceed the OS limit for Unix socket paths.
        """
        names = ("scheduler_input", "detokenizer_input", "tokenizer_input", "scheduler_rpc")
        paths = {}
        for name in names:
            path = os.path.join(root, name)
            if len(os.fsencode(path)) > _MAX_IPC_PATH_BYTES:
                raise ValueError(
                    f"IPC socket path {path!r} is longer than {_MAX_IPC_PATH_BYTES} bytes; "
                    "use a shorter temp directory (set TMPDIR)"
                )
            paths[name] = f"ipc://{path}"
        return cls(root=root, **paths)

    @classmethod
    def in_new_tempdir(cls, prefix: str = "radixlm-") -> "IpcPaths":
        """Endpoints in a fresh private temp directory named with this pid (one per launch).

        Falls back to ``/tmp`` when ``$TMPDIR`` is too long for Unix socket paths.
        """
        root = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")
        if len(os.fsencode(root)) > _MAX_IPC_PATH_BYTES - 24 and os.path.isdir("/tmp"):
            os.rmdir(root)
            root = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir="/tmp")
        return cls.in_dir(root)

    def for_dp_rank(self, dp_rank: int, dp_size: int) -> "IpcPaths":
        """The endpoints data-parallel replica ``dp_rank`` of ``dp_size`` uses: these paths when
        ``dp_size`` is 1, else its own scheduler sockets in ``<root>/dp<k>/`` (created) and the shared
        detokenizer and tokenizer sockets. Raises ValueError as ``in_dir`` does."""
        if dp_size == 1:
            return self
        sub = os.path.join(self.root, f"dp{dp_rank}")
        os.makedirs(sub, exist_ok=True)
        own = IpcPaths.in_dir(sub)
        return dataclasses.replace(own, detokenizer_input=self.detokenizer_input,
                                   tokenizer_input=self.tokenizer_input, launch_root=self.launch_root or self.root)

    def remove(self) -> None:
        """Delete the launch's directory and its socket files (call once every process has exited)."""
        shutil.rmtree(self.launch_root or self.root, ignore_errors=True)


def _open(ctx: zmq.Context, kind: int, endpoint: str, bind: bool) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM if kind == zmq.PUSH else zmq.RCVHWM, 0)
    try:
        if bind:
            sock.bind(endpoint)
        else:
            sock.connect(endpoint)
    except zmq.ZMQError:
        sock.close(linger=0)
        raise
    return sock


class _SocketOwner:
    """Shared close/context-manager plumbing for the wrappers below."""

    socket: zmq.Socket

    def close(self) -> None:
        """Close the socket immediately, dropping unsent frames (linger 0). Idempotent."""
        if not self.socket.closed:
            self.socket.close(linger=0)

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PushSender(_SocketOwner):
    """A PUSH socket that sends io_struct messages.

    Args:
        ctx: a ``zmq.Context`` (sync).
        endpoint: e.g. ``IpcPaths.scheduler_input``.
        bind: True to bind (the endpoint's owner), False to connect.

    Raises:
        zmq.ZMQError: the endpoint cannot be bound/connected.
    """

    def __init__(self, ctx: zmq.Context, endpoint: str, bind: bool) -> None:
        self.endpoint = endpoint
        self.socket = _open(ctx, zmq.PUSH, endpoint, bind)

    def send(self, msg: Message) -> None:
        """Encode and queue one message. Blocks only while a bound PUSH has no peer at all."""
        self.socket.send(encode(msg), copy=False)


class PullReceiver(_SocketOwner):
    """A PULL socket that yields io_struct messages (sync).

    ``fileno()`` exposes ZMQ's notification fd for event loops; it is edge-triggered, so after
    it fires, drain with ``recv_all_nowait()`` (asyncio code should prefer ``AsyncPullReceiver``).
    Decode errors (``msgspec.ValidationError`` for an unknown tag, ``msgspec.DecodeError`` for
    malformed bytes) propagate to the caller; the offending frame is consumed.
    """

    def __init__(self, ctx: zmq.Context, endpoint: str, bind: bool) -> None:
        self.endpoint = endpoint
        self.socket = _open(ctx, zmq.PULL, endpoint, bind)

    def recv(self, timeout_ms: Optional[int] = None) -> Optional[Message]:
        """Next message; waits at most ``timeout_ms`` milliseconds (None: forever).

        Returns None when the timeout passes with nothing received.
        """
        if timeout_ms is not None and not self.socket.poll(timeout_ms, zmq.POLLIN):
            return None
        return decode(self.socket.recv(copy=False).bytes)

    def recv_all_nowait(self) -> list[Message]:
        """Every message already queued, in arrival order, without blocking (maybe empty)."""
        out: list[Message] = []
        while True:
            try:
                frame = self.socket.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return out
            out.append(decode(frame.bytes))

    def fileno(self) -> int:
        """ZMQ's edge-triggered notification file descriptor (``zmq.FD``)."""
        return int(self.socket.getsockopt(zmq.FD))


class AsyncPullReceiver(_SocketOwner):
    """A PULL socket for asyncio code (the TokenizerManager's output loop).

    Args:
        ctx: a ``zmq.asyncio.Context``, or a sync ``zmq.Context`` (shadowed, sharing its io threads).
        endpoint, bind: as for ``PullReceiver``.
    """

    def __init__(self, ctx: zmq.Context, endpoint: str, bind: bool) -> None:
        actx = ctx if isinstance(ctx, zmq.asyncio.Context) else zmq.asyncio.Context.shadow(ctx)
        self.endpoint = endpoint
        self.socket = _open(actx, zmq.PULL, endpoint, bind)

    async def recv(self) -> Message:
        """Await the next message. Raises on decode errors as ``PullReceiver.recv`` does."""
        frame = await self.socket.recv()
        return decode(frame)

    def recv_all_nowait(self) -> list[Message]:
        """Every message already queued, without awaiting (maybe empty)."""
        out: list[Message] = []
        while True:
            try:
                # zmq.asyncio sockets return a completed future for NOBLOCK or raise zmq.Again.
                fut = self.socket.recv(zmq.NOBLOCK)
                frame = fut.result()
            except zmq.Again:
                return out
            out.append(decode(frame))


async def receive_forever(receiver: AsyncPullReceiver, handle: Callable[[Message], None], who: str) -> None:
    """Await each message of ``receiver`` and pass it to ``handle``, until cancelled.

    A frame that cannot be decoded is logged (as ``who``: cannot decode ...) and dropped, so one bad
    frame never stops the loop; ``handle``'s own exceptions propagate (they are bugs).
    """
    while True:
        try:
            msg = await receiver.recv()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("%s: cannot decode a message; dropped", who)
            continue
        handle(msg)
