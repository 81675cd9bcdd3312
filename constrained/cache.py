"""Asynchronous, cached grammar compilation (SGLang's ``base_grammar_backend`` cache).

``request(spec)`` returns a ``concurrent.futures.Future[CompiledGrammar]`` at once; the compile runs
on a small thread pool, off the scheduler's critical path. Equal specs share one future, so a
grammar is compiled once however many requests use it (a compile still in flight included).
Failures are cached too (a ``GrammarError`` is deterministic, so the second bad request fails
fast); a *cancelled* future (e.g. after a scheduler-side timeout) is dropped and recompiled on the
next request. Entries are evicted least-recently-used beyond ``max_entries``.

The scheduler polls ``future.done()`` each step (never blocks), then calls ``future.result()``
(raises ``GrammarError``) and ``backend.new_matcher(compiled)`` per request.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from radixlm.constrained.base import CompiledGrammar, GrammarBackend
from radixlm.constrained.spec import GrammarSpec


class GrammarCache:
    """Thread-safe cache of compile futures keyed by ``GrammarSpec`` (= ``(kind, text)``).

    Attributes:
        num_compiles: compiles submitted (cache misses).
        num_hits: requests answered by an existing future (done or in flight).
    """

    def __init__(self, backend: GrammarBackend, max_workers: int = 2, max_entries: int = 4096):
        if max_workers < 1 or max_entries < 1:
            raise ValueError("max_workers and max_entries must be >= 1")
        self.backend = backend
        self.max_entries = max_entries
        self.num_compiles = 0
        self.num_hits = 0
        self._lock = threading.Lock()
        self._entries: OrderedDict[GrammarSpec, Future[CompiledGrammar]] = OrderedDict()
        self._pool = ThreadPoolExecutor(max_workers=max_workers,
                                        thread_name_prefix="radixlm-grammar")

    def request(self, spec: GrammarSpec) -> Future[CompiledGrammar]:
        """The (possibly shared, possibly already done) compile future of ``spec``.

        Raises:
            RuntimeError: after ``shutdown()``.
        """
        with self._lock:
            fut = self._entries.get(spec)
            if fut is not None and not fut.cancelled():
                self._entries.move_to_end(spec)
                self.num_hits += 1
                return fut
            fut = self._pool.submit(self.backend.compile, spec)
            self.num_compiles += 1
            self._entries[spec] = fut
            self._entries.move_to_end(spec)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)  # a running compile still finishes for its waiters
            return fut

    def get(self, spec: GrammarSpec, timeout: float | None = None) -> CompiledGrammar:
        """Blocking convenience (tests, offline use): ``request(spec).result(timeout)``.

        Raises:
            GrammarError: invalid grammar. TimeoutError: not compiled within ``timeout`` seconds.
        """
        return self.request(spec).result(timeout)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, spec: object) -> bool:
        with self._lock:
            return spec in self._entries

    def clear(self) -> None:
        """Forget every entry (``/flush_cache``) and the backend's own cache; in-flight compiles
        still complete for the requests already holding their futures."""
        with self._lock:
            self._entries.clear()
        self.backend.clear_cache()

    def shutdown(self, wait: bool = False) -> None:
        """Stop the pool; queued compiles are cancelled (their futures report cancelled)."""
        self._pool.shutdown(wait=wait, cancel_futures=True)
