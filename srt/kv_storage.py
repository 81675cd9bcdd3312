"""The storage tier of the hierarchical KV cache: one file per KV page (``--hicache-storage-backend file``).

Layout: ``DIR/<fingerprint hex>/<digest hex[:2]>/<digest hex>.kvpage``. The fingerprint names the
model, KV dtype, page size, KV layout per rank and TP rank (``kv_fingerprint``), so a server with a
different model or layout looks in another folder and never reads these pages. The digest is the
chain digest of the token prefix up to and including the page (``radix_cache.tiers.page_digests``).

A page file is a 64-byte header then the page's bytes::

    magic "RLMKVPG1" | fingerprint (16 B) | digest (16 B) | payload length (u64 LE) | BLAKE2b-128 of payload

Files are written to a temporary name in the same folder and renamed (atomic on POSIX), so a reader
(another dp replica, a restarted server) sees a whole file or none. On read every header field and
the payload checksum are verified; a truncated, corrupted or foreign file is logged as a warning,
deleted and reported as a miss, so the caller recomputes the page. Size cap: once the files exceed
``max_bytes``, the least recently used ones (by mtime; a read refreshes it) are deleted. The size
account covers the files this process saw at start plus its own writes; other replicas' writes are
found by lookups (``contains`` asks the file system) and counted when read.

Bytes only: the controller turns tensors into payloads. No torch here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import struct
import threading
from collections import OrderedDict
from typing import Any, Callable, Optional

logger = logging.getLogger(__name__)

MAGIC = b"RLMKVPG1"
_HEADER = struct.Struct("<8s16s16sQ16s")
HEADER_SIZE = _HEADER.size  # 64
SUFFIX = ".kvpage"


def kv_fingerprint(desc: dict[str, Any]) -> bytes:
    """16-byte fingerprint of a KV layout description (JSON-serializable, keys sorted)."""
    return hashlib.blake2b(json.dumps(desc, sort_keys=True).encode(), digest_size=16).digest()


class FileKVStorage:
    """Page files under ``root`` for one fingerprint; thread-safe (a write-back thread shares it).

    Args:
        root: the storage folder (``--hicache-storage-dir``); created if missing.
        fingerprint: 16 bytes from ``kv_fingerprint``; ``desc`` is written beside the pages as
            ``fingerprint.json`` for people.
        page_bytes: the exact payload size of one page.
        max_bytes: size cap of this fingerprint's files (header included).
    """

    def __init__(self, root: str, fingerprint: bytes, desc: dict[str, Any], page_bytes: int, max_bytes: int) -> None:
        self.fingerprint = fingerprint
        self.page_bytes = page_bytes
        self.file_bytes = page_bytes + HEADER_SIZE
        self.max_bytes = max_bytes
        self.dir = os.path.join(os.path.abspath(os.path.expanduser(root)), fingerprint.hex())
        os.makedirs(self.dir, exist_ok=True)
        self._write_atomic(os.path.join(self.dir, "fingerprint.json"), json.dumps(desc, sort_keys=True, indent=1).encode())
        self._lock = threading.Lock()
        self._files: OrderedDict[str, int] = OrderedDict()  # path -> size, least recently used first
        self._bytes = 0
        self.stats = {"hits": 0, "misses": 0, "writes": 0, "skipped_bad": 0, "evicted": 0}
        self._scan()

    # ---- lookups ----------------------------------------------------------------------------------
    def path(self, digest: bytes) -> str:
        h = digest.hex()
        return os.path.join(self.dir, h[:2], h + SUFFIX)

    def contains(self, digest: bytes) -> bool:
        """Whether a page file exists (any replica's); says nothing about its validity."""
        return os.path.exists(self.path(digest))

    def has_page(self, digest: bytes) -> bool:
        """Whether a page file with a valid header and size exists (the payload checksum is only
        verified by ``get``): a writer skips such a page and replaces anything else."""
        return self._header_ok(self.path(digest), digest)

    def get(self, digest: bytes) -> Optional[bytes]:
        """The payload of ``digest``'s page, or None when absent or invalid (warned, file deleted)."""
        path = self.path(digest)
        try:
            with open(path, "rb") as f:
                data = f.read(self.file_bytes + 1)
        except FileNotFoundError:
            with self._lock:
                self.stats["misses"] += 1
            return None
        except OSError as e:
            self._reject(path, f"unreadable ({e})")
            return None
        problem = self._check(data, digest)
        if problem is not None:
            self._reject(path, problem)
            return None
        try:
            os.utime(path)  # LRU: a read makes the page recent
        except OSError:
            pass
        with self._lock:
            self.stats["hits"] += 1
            if path in self._files:
                self._files.move_to_end(path)
            else:  # written by another replica
                self._files[path] = len(data)
                self._bytes += len(data)
        return data[HEADER_SIZE:]

    def _check(self, data: bytes, digest: bytes) -> Optional[str]:
        if len(data) < HEADER_SIZE:
            return f"truncated ({len(data)} bytes, header is {HEADER_SIZE})"
        magic, fp, dg, length, checksum = _HEADER.unpack_from(data)
        if magic != MAGIC:
            return "not a radixlm KV page (bad magic)"
        if fp != self.fingerprint:
            return f"foreign fingerprint {fp.hex()} (model, dtype, page size or TP layout differ)"
        if dg != digest:
            return "holds another prefix's page"
        if length != self.page_bytes:
            return f"payload of {length} bytes, expected {self.page_bytes}"
        payload = data[HEADER_SIZE:]
        if len(payload) != length:
            return f"truncated payload ({len(payload)} of {length} bytes)"
        if hashlib.blake2b(payload, digest_size=16).digest() != checksum:
            return "checksum mismatch (corrupted)"
        return None

    def _reject(self, path: str, problem: str) -> None:
        logger.warning("hicache storage: skipping %s: %s; the page is recomputed", path, problem)
        with self._lock:
            self.stats["skipped_bad"] += 1
            self._forget(path)
        try:
            os.unlink(path)
        except OSError:
            pass

    # ---- writes -----------------------------------------------------------------------------------
    def put(self, digest: bytes, payload: bytes) -> bool:
        """Write ``digest``'s page unless a file with a valid header and size exists; False when skipped.

        Only the header is read back (not the payload checksum): a truncated or foreign file is replaced
        here, a corrupted payload when it is next read.

        Raises:
            ValueError: if the payload is not ``page_bytes`` long.
        """
        if len(payload) != self.page_bytes:
            raise ValueError(f"page payload of {len(payload)} bytes, expected {self.page_bytes}")
        path = self.path(digest)
        if self._header_ok(path, digest):
            return False
        header = _HEADER.pack(MAGIC, self.fingerprint, digest, len(payload),
                              hashlib.blake2b(payload, digest_size=16).digest())
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            self._write_atomic(path, header + payload)
        except OSError as e:
            logger.warning("hicache storage: cannot write %s: %s", path, e)
            return False
        with self._lock:
            self.stats["writes"] += 1
            self._forget(path)
            self._files[path] = self.file_bytes
            self._bytes += self.file_bytes
            victims = self._over_cap()
        for victim in victims:
            try:
                os.unlink(victim)
            except OSError:
                pass
        return True

    def _header_ok(self, path: str, digest: bytes) -> bool:
        try:
            with open(path, "rb") as f:
                head = f.read(HEADER_SIZE)
                size = os.fstat(f.fileno()).st_size
        except OSError:
            return False
        if len(head) < HEADER_SIZE or size != self.file_bytes:
            return False
        magic, fp, dg, length, _ = _HEADER.unpack(head)
        return magic == MAGIC and fp == self.fingerprint and dg == digest and length == self.page_bytes

    def _over_cap(self) -> list[str]:
        victims = []
        while self._bytes > self.max_bytes and self._files:
            path, size = self._files.popitem(last=False)
            self._bytes -= size
            self.stats["evicted"] += 1
            victims.append(path)
        return victims

    @staticmethod
    def _write_atomic(path: str, data: bytes) -> None:
        tmp = f"{path}.tmp{os.getpid()}.{threading.get_ident()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    # ---- upkeep -----------------------------------------------------------------------------------
    def flush(self) -> int:
        """Delete every page file of this fingerprint (the storage tier's explicit flush). Returns how many."""
        with self._lock:
            self._scan_locked()
            paths = list(self._files)
            self._files.clear()
            self._bytes = 0
        for p in paths:
            try:
                os.unlink(p)
            except OSError:
                pass
        return len(paths)

    def size_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def num_files(self) -> int:
        with self._lock:
            return len(self._files)

    def _forget(self, path: str) -> None:
        size = self._files.pop(path, None)
        if size is not None:
            self._bytes -= size

    def _scan(self) -> None:
        with self._lock:
            self._scan_locked()
            victims = self._over_cap()
        for v in victims:
            try:
                os.unlink(v)
            except OSError:
                pass

    def _scan_locked(self) -> None:
        found = []
        for sub in os.scandir(self.dir):
            if not sub.is_dir():
                continue
            for entry in os.scandir(sub.path):
                if entry.name.endswith(SUFFIX):
                    st = entry.stat()
                    found.append((st.st_mtime_ns, entry.path, st.st_size))
        found.sort()
        self._files = OrderedDict((p, size) for _, p, size in found)
        self._bytes = sum(size for _, _, size in found)


class QueueThread:
    """One daemon thread that hands queued items to ``handle`` in order; an exception is logged with
    ``what`` and the thread goes on (these tiers are only a cache). ``join`` waits until every queued
    item is handled; ``close`` handles what is queued, then stops the thread."""

    def __init__(self, name: str, handle: Callable[[Any], None], what: str) -> None:
        self._handle, self._what = handle, what
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def put(self, item: Any) -> None:
        self._queue.put(item)

    def join(self) -> None:
        self._queue.join()

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                self._handle(item)
            except Exception:
                logger.exception("hicache storage: %s failed", self._what)
            finally:
                self._queue.task_done()


_STOP = object()


class BackgroundWriter:
    """One thread that writes queued pages (``--hicache-write-policy write_back``): the scheduler
    hands over bytes and goes on; ``drain`` waits until everything queued is on disk."""

    def __init__(self, storage: FileKVStorage) -> None:
        self.storage = storage
        self._thread = QueueThread("hicache-writer", lambda item: storage.put(*item), "write-back of a page")

    def submit(self, digest: bytes, payload: bytes) -> None:
        self._thread.put((digest, payload))

    def drain(self) -> None:
        self._thread.join()

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        self._thread.close()
