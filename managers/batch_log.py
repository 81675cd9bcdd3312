"""The scheduler's per-batch log lines, in SGLang's words, so an operator sees what each step ran.

- Every extend (prefill) batch::

    Prefill batch. #new-seq: 17, #new-token: 1024, #cached-token: 8192, token usage: 0.12, #running-req: 0, #queue-req: 95

  ``#new-seq`` requests in the batch, ``#new-token`` tokens computed (``#cached-token`` of them came
  from the radix cache for requests starting here), ``token usage`` the KV pool's occupied fraction
  (slots held by requests or by unevictable tree nodes; evictable cached pages count as free, as in
  SGLang), ``#running-req`` requests decoding before this batch joins them, ``#queue-req`` still waiting.
- Every ``--decode-log-interval`` decode steps (SGLang's flag, default 40)::

    Decode batch. #running-req: 128, #token: 71680, token usage: 0.34, gen throughput (token/s): 812.40, #queue-req: 0

  ``#token`` the occupied KV slots, ``gen throughput`` the tokens generated since the previous decode
  line over the wall time since it (seconds from ``clock``, ``time.perf_counter`` by default), so
  it includes the extend steps in between, as SGLang's does.

Standard library only; the scheduler hands in plain counts.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

logger = logging.getLogger(__name__)


class BatchLog:
    """Args: decode_log_interval (decode steps between two "Decode batch." lines, >= 1); total_tokens
    (the KV pool's size in tokens, > 0); clock (seconds, monotonic).

    Raises:
        ValueError: a non-positive interval or pool size.
    """

    def __init__(self, decode_log_interval: int, total_tokens: int, clock: Callable[[], float] = time.perf_counter):
        if decode_log_interval < 1:
            raise ValueError(f"decode_log_interval must be >= 1, got {decode_log_interval}")
        if total_tokens < 1:
            raise ValueError(f"total_tokens must be >= 1, got {total_tokens}")
        self.interval = decode_log_interval
        self.total_tokens = total_tokens
        self.clock = clock
        self.decode_steps = 0
        self.generated = 0  # tokens generated since the last decode line
        self.since = clock()
        self.gen_throughput = 0.0  # tokens/s of the last decode line's window (SGLang's gen_throughput)

    def extend(self, new_seqs: int, new_tokens: int, cached_tokens: int, used_tokens: int, running: int,
               queued: int) -> None:
        """One extend batch ran (counts as described in the module docstring)."""
        logger.info("Prefill batch. #new-seq: %d, #new-token: %d, #cached-token: %d, token usage: %.2f, "
                    "#running-req: %d, #queue-req: %d", new_seqs, new_tokens, cached_tokens,
                    used_tokens / self.total_tokens, running, queued)

    def generated_tokens(self, n: int) -> None:
        """n tokens were appended to requests' outputs (by any step: extend, decode or verify)."""
        self.generated += n

    def decode(self, running: int, used_tokens: int, queued: int) -> None:
        """One decode (or verify) step ran; every interval-th writes the line and restarts the window."""
        self.decode_steps += 1
        if self.decode_steps % self.interval:
            return
        now = self.clock()
        elapsed = now - self.since
        throughput = self.generated / elapsed if elapsed > 0 else 0.0
        self.gen_throughput = throughput
        logger.info("Decode batch. #running-req: %d, #token: %d, token usage: %.2f, gen throughput (token/s): %.2f, "
                    "#queue-req: %d", running, used_tokens, used_tokens / self.total_tokens, throughput, queued)
        self.generated, self.since = 0, now
