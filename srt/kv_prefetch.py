"""Background prefetch from the storage tier of the hierarchical KV cache (SGLang's HiCache storage
prefetch, ``--hicache-storage-prefetch-policy``).

When a request enters the waiting queue and the first page its prompt misses on device and host is in
storage, a ``PrefetchTask`` is queued; one reader thread reads the task's page files in prefix order
(``FileKVStorage.get`` verifies each file) and appends the payloads to the task until the first miss,
the end, or a cancel. The scheduler keeps running other requests meanwhile and decides when the
request may be admitted (``PrefetchPolicy.ready``):

- ``best_effort``: at once; admission uses the pages read so far and recomputes the rest;
- ``wait_complete``: once every page of the task is read (or the read stopped at a miss);
- ``timeout`` (the default, as in SGLang since 2026-05): like ``wait_complete``, but at most
  ``min(timeout_max, timeout_base + timeout_per_ki_token * prompt_tokens / 1024)`` seconds after the
  task started (defaults 2.0 s, 0.1 s, 30.0 s: SGLang's ``PrefetchTimeoutConfig``).

Staged payloads are bytes held by the task until admission turns them into device pages; the pages
in flight are capped (``max_pages``: a request whose task would exceed it reads storage at admission,
as without prefetch). Bytes only: no torch here.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Optional

from radixlm.srt.kv_storage import FileKVStorage, QueueThread

PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")


@dataclass(frozen=True)
class PrefetchPolicy:
    """When a request whose storage prefetch is under way may be admitted.

    Args:
        name: one of ``PREFETCH_POLICIES``.
        timeout_base / timeout_per_ki_token / timeout_max: seconds (``timeout`` only).
    """

    name: str = "timeout"
    timeout_base: float = 2.0
    timeout_per_ki_token: float = 0.1
    timeout_max: float = 30.0

    def deadline(self, start: float, num_tokens: int) -> float:
        """``time.monotonic()`` value after which a ``timeout`` task stops holding its request."""
        return start + min(self.timeout_max, self.timeout_base + self.timeout_per_ki_token * num_tokens / 1024)

    def ready(self, task: "PrefetchTask", now: float) -> bool:
        if self.name == "best_effort" or task.done.is_set():
            return True
        return self.name == "timeout" and now >= task.deadline


@dataclass(eq=False)
class PrefetchTask:
    """Pages ``start .. start + len(digests) - 1`` of one request's prompt, read in order.

    ``payloads[i]`` is the page of ``digests[i]`` (appended by the reader thread; read the length
    first, then the items). ``done`` is set when the reader stopped (end, miss or cancel).
    """

    start: int
    digests: list[bytes]
    deadline: float
    payloads: list[bytes] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    cancelled: bool = False

    def staged(self) -> list[bytes]:
        """The payloads read so far (a snapshot)."""
        n = len(self.payloads)
        return self.payloads[:n]


class StoragePrefetcher:
    """One reader thread over ``storage``; at most ``max_pages`` pages reserved by live tasks."""

    def __init__(self, storage: FileKVStorage, max_pages: int) -> None:
        self.storage = storage
        self.max_pages = max_pages
        self._reserved = 0
        self.stats = {"tasks": 0, "pages_read": 0, "skipped_full": 0}
        self._thread = QueueThread("hicache-prefetch", self._read, "prefetch")

    @property
    def reserved_pages(self) -> int:
        return self._reserved

    def submit(self, start: int, digests: list[bytes], deadline: float) -> Optional[PrefetchTask]:
        """Queue a read of ``digests`` (pages from ``start``); None when the cap leaves no room."""
        if not digests:
            return None
        if self._reserved + len(digests) > self.max_pages:
            self.stats["skipped_full"] += 1
            return None
        self._reserved += len(digests)
        task = PrefetchTask(start, digests, deadline)
        self.stats["tasks"] += 1
        self._thread.put(task)
        return task

    def release(self, task: PrefetchTask) -> None:
        """The scheduler is done with ``task`` (admitted or gone): stop reading, free its reservation."""
        task.cancelled = True
        self._reserved -= len(task.digests)

    def close(self) -> None:
        self._thread.close()

    def _read(self, task: PrefetchTask) -> None:
        try:
            for d in task.digests:
                if task.cancelled:
                    break
                payload = self.storage.get(d)
                if payload is None:
                    break
                task.payloads.append(payload)
                self.stats["pages_read"] += 1
        finally:  # a failed read is logged by the thread: the pages are recomputed
            task.done.set()
