"""Graceful shutdown of the HTTP server: SIGTERM / SIGINT drain the open requests before it stops.

As SGLang's server does on SIGTERM ("Gracefully exiting... Remaining number of requests N"), the
first signal stops taking new work and lets what is open finish: new requests, ``/health`` and
``/health_generate`` answer 503 (a load balancer or a Kubernetes readiness probe moves traffic away),
and the server stops once no request is open. A second signal stops it at once (Ctrl-C twice), as
does ``--shutdown-timeout`` seconds of draining; whatever is still open then ends with a 503. With
``--shutdown-timeout 0`` the first signal stops at once.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import uvicorn

logger = logging.getLogger("radixlm.launch_server")

DRAIN_LOG_INTERVAL_S = 5.0


class DrainingServer(uvicorn.Server):
    """uvicorn's server, except that its SIGTERM / SIGINT handler only records the signal in
    ``signals``; :class:`Drain` decides when the server stops (``should_exit``)."""

    def __init__(self, config: uvicorn.Config, signals: list[int]):
        super().__init__(config)
        self.signals = signals

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.signals.append(sig)


class Drain:
    """Drives one server's shutdown from the signals received so far (polled by the launcher's watchdog).

    Args:
        server: what to stop (``should_exit``).
        tm: the TokenizerManager: ``draining`` refuses new requests; ``states`` are the open ones.
        timeout_s: longest drain in seconds (None: until every open request has finished).
    """

    def __init__(self, server: Any, tm: Any, timeout_s: Optional[float]):
        self.server = server
        self.tm = tm
        self.timeout_s = timeout_s
        self.started: Optional[float] = None
        self._logged = 0.0

    def poll(self, num_signals: int, now: float) -> None:
        """Begin draining at the first signal; stop the server when nothing is open, at the second
        signal, or when the timeout has passed."""
        if num_signals == 0 or self.server.should_exit:
            return
        open_requests = len(self.tm.states)
        if self.started is None:
            self.started = self._logged = now
            self.tm.draining = True
            if open_requests and self.timeout_s != 0:
                logger.info("shutting down: new requests get 503; waiting for %d open request(s) to finish "
                            "(%s; a second SIGTERM / Ctrl-C stops now)", open_requests,
                            "no time limit" if self.timeout_s is None else f"at most {self.timeout_s:g} s")
        timed_out = self.timeout_s is not None and now - self.started >= self.timeout_s
        if num_signals > 1 or open_requests == 0 or timed_out:
            if open_requests:
                logger.info("stopping with %d request(s) still open (%s)", open_requests,
                            "second signal" if num_signals > 1 else "--shutdown-timeout")
            self.server.should_exit = True
        elif now - self._logged >= DRAIN_LOG_INTERVAL_S:
            self._logged = now
            logger.info("shutting down: %d request(s) still open", open_requests)
