"""Busy neighbours for benchmarks: ``busy_processes(n)`` keeps n CPU-bound processes running (each a
pure-Python loop, like a test run or a build beside the server) while the block runs, so every
system is measured on a machine whose cores are also wanted by someone else. They are stopped
(SIGTERM, then SIGKILL) when the block ends, also on an exception."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

_SPIN = "import signal, sys\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nx = 0\nwhile True:\n    x += 1\n"


@contextlib.contextmanager
def busy_processes(n: int) -> Iterator[list[int]]:
    """Run ``n`` (>= 0) busy-looping child processes for the duration of the block; yields their pids."""
    procs = [subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.DEVNULL) for _ in range(max(n, 0))]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
