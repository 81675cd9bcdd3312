"""Waiting for a server process that was just started to answer ``GET /health`` with 200.

One loop for everything that launches ``radixlm.srt.launch_server`` as a child process (the Ray Serve
replica, the test and benchmark harnesses); each caller words its own error. Stdlib + httpx only.
"""

from __future__ import annotations

import socket
import subprocess
import time
from urllib.parse import urlsplit
from typing import Literal

import httpx

HealthWait = Literal["healthy", "exited", "timeout"]


def _listening(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port or 80), timeout=0.2):
            return True
    except OSError:
        return False


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float, poll_s: float = 0.05) -> HealthWait:
    """Poll ``GET {url}/health`` (2 s per try) for up to ``timeout_s`` seconds.

    Until the port accepts connections it polls with a bare TCP connect every ``poll_s`` seconds
    (an httpx call builds an SSL context each time: CPU the starting server needs); ``/health`` is
    asked once the port listens.

    Returns:
        ``"healthy"`` once it answers 200; ``"exited"`` if ``proc`` ended first (its ``returncode``
        says how); ``"timeout"`` if neither happened in time (``proc`` is left running).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return "exited"
        if _listening(url):
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    return "healthy"
            except httpx.HTTPError:
                pass
        time.sleep(poll_s)
    return "timeout"
