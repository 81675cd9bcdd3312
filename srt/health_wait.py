"""Waiting for a server process that was just started to answer ``GET /health`` with 200.

One loop for everything that launches ``radixlm.srt.launch_server`` as a child process (the Ray Serve
replica, the test and benchmark harnesses); each caller words its own error. Stdlib + httpx only.
"""

from __future__ import annotations

import subprocess
import time
from typing import Literal

import httpx

HealthWait = Literal["healthy", "exited", "timeout"]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float, poll_s: float = 0.3) -> HealthWait:
    """Poll ``GET {url}/health`` (2 s per try, every ``poll_s`` seconds) for up to ``timeout_s`` seconds.

    Returns:
        ``"healthy"`` once it answers 200; ``"exited"`` if ``proc`` ended first (its ``returncode``
        says how); ``"timeout"`` if neither happened in time (``proc`` is left running).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return "exited"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return "healthy"
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    return "timeout"
