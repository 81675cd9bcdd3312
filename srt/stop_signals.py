"""SIGTERM / SIGINT handling of a launcher process that starts children, then waits.

While starting, a signal raises ``StopDuringStartup`` out of whatever is running (loading a model,
waiting for a child's ready), so the launcher unwinds into its cleanup at once; once started, a
signal is only recorded in ``received`` and the launcher's wait loop sees it.
"""

from __future__ import annotations

import logging
import signal
from typing import Any

LOG_FORMAT = "[%(asctime)s %(processName)s] %(levelname)s %(name)s: %(message)s"


class StopDuringStartup(BaseException):
    """Raised by the handler while ``StopSignals.started`` is False."""


class StopSignals:
    """Install with ``install()``; set ``started = True`` when the launcher begins waiting (and
    again before cleanup, so a second signal cannot interrupt it). ``received``: signal numbers."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.started = False

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.received.append(signum)
        if not self.started:
            raise StopDuringStartup()


def configure_launcher_logging(level: str) -> None:
    """Log to stderr with the process name in every line (the children's format too)."""
    logging.basicConfig(level=level.upper(), force=True, format=LOG_FORMAT)
