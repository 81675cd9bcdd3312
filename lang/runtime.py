"""``Runtime``: launch ``python -m radixlm.srt.launch_server`` as a child process and talk to it.

The server runs in its own process group, so ``shutdown()`` (also run at exit and by ``with``)
stops the launcher with SIGTERM and then kills anything of the group still alive.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

from radixlm.lang.runtime_endpoint import RuntimeEndpoint

STOP_TIMEOUT_S = 20.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_flags(server_args: dict[str, Any]) -> list[str]:
    """``{"page_size": 16, "disable_radix_cache": True}`` -> ``["--page-size", "16", "--disable-radix-cache"]``."""
    flags: list[str] = []
    for key, value in server_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not None and value is not False:
            flags += [flag, str(value)]
    return flags


class Runtime:
    """A server launched for this process.

    Args:
        model_path: model to serve (``None``: the SmolLM2 demo model).
        host, port: where it listens (``port=None``: a free port).
        api_key: passed to the server and used by the endpoint.
        timeout_s: how long to wait for ``GET /health``.
        wait: wait for the server here; with False, call :meth:`wait_ready` before use (lets
            several servers start at once).
        chat_template: forwarded to :class:`RuntimeEndpoint`.
        **server_args: more server flags (``page_size=16`` -> ``--page-size 16``).

    Attributes: ``url``, ``endpoint`` (a RuntimeEndpoint; ``set_default_backend(runtime)`` uses it),
    ``process``, ``log_path``.

    Raises:
        RuntimeError: ``port`` is taken (before anything starts), or the server exited or was not
            healthy in time (its log tail is in the message).
    """

    def __init__(self, model_path: Optional[str] = None, *, host: str = "127.0.0.1", port: Optional[int] = None,
                 api_key: Optional[str] = None, timeout_s: float = 300.0, chat_template: Any = None,
                 wait: bool = True, **server_args: Any):
        if port:  # checked here: the /health of whatever holds the port would pass for ours
            from radixlm.srt.launch_server import port_unavailable  # the server's own check (torch-free)

            reason = port_unavailable(host, port)
            if reason is not None:
                raise RuntimeError(f"{reason} (another server?); pass port=None for a free port")
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        args = {"model_path": model_path, "host": host, "port": self.port, "api_key": api_key, **server_args}
        cmd = [sys.executable, "-m", "radixlm.srt.launch_server", *server_flags(args)]
        fd, self.log_path = tempfile.mkstemp(prefix="radixlm-runtime-", suffix=".log")
        with os.fdopen(fd, "wb") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        atexit.register(self.shutdown)
        self.endpoint: Optional[RuntimeEndpoint] = None
        self._ready_args = (time.monotonic() + timeout_s, api_key, chat_template)
        if wait:
            self.wait_ready()

    def wait_ready(self) -> "Runtime":
        """Wait until the server is healthy and connect :attr:`endpoint` (idempotent).

        Raises:
            RuntimeError: the server exited or did not become healthy in time (it is shut down).
        """
        if self.endpoint is not None:
            return self
        deadline, api_key, chat_template = self._ready_args
        try:
            self._wait_healthy(deadline)
            self.endpoint = RuntimeEndpoint(self.url, api_key=api_key, chat_template=chat_template)
        except BaseException:
            self.shutdown()
            raise
        return self

    def _wait_healthy(self, deadline: float) -> None:
        import httpx

        while True:  # check at least once: a server started long ago may be up already
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()[-4000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy in time:\n{self.log()[-4000:]}")
            time.sleep(0.25)

    def log(self) -> str:
        """Everything the server printed so far."""
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def generate(self, prompt: Any, sampling_params: Optional[dict] = None, **fields: Any) -> Any:
        """POST ``/generate`` (``text`` = prompt) and return the JSON response."""
        endpoint = self.wait_ready().endpoint
        assert endpoint is not None
        return endpoint.request({"text": prompt, "sampling_params": sampling_params or {}, **fields})

    def shutdown(self) -> None:
        """Stop the server now (idempotent): SIGTERM twice (the first alone would let open requests
        finish first), then SIGKILL for its whole process group."""
        if self.endpoint is not None:
            self.endpoint.shutdown()
        proc = self.process
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        try:  # children that outlived the launcher
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if proc.poll() is None:
            proc.wait(5)
        atexit.unregister(self.shutdown)

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"Runtime({self.url!r})"
