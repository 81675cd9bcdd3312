"""Hierarchical KV cache (``--enable-hierarchical-cache``): moves pages between the device KV pool,
the host pool and the storage tier, under the radix tree.

The radix tree calls this controller as its ``TierListener``:

- ``on_insert`` (``--hicache-write-policy write_through``): pages new to the tree are copied to the
  host pool at once and, with a storage backend, written to storage in the same step;
- ``on_evict`` (both policies): an evicted leaf's pages are copied to the host pool unless it still
  holds them; with ``write_back`` they go to storage here, through a background writer thread, and
  at shutdown (``close``) every page still only on device is written back too.

``KVManager.match_and_lock`` calls ``load_back`` after the device match: it continues the match
page by page through the host index, then through storage, copies what it found into freshly
allocated device pages (evicting others if needed), inserts them into the tree and moves the
request's lock onto the longer match. The request's extend then starts after them.

Storage reads run in the background (``srt.kv_prefetch``): ``sync_prefetch`` queues a read for each
new waiting request whose prompt continues in storage, ``held`` tells the scheduler which of them
``--hicache-storage-prefetch-policy`` still holds back (other requests keep running meanwhile), and
``load_back`` takes the pages read so far. The host -> device copies run at admission inside the
scheduler step: on CPU a page copy is a memcpy (docs/benchmarks.md compares it with recomputing the
prefix); a CUDA path would issue the same copies on a side stream from the pinned host buffer and let
the request wait for its event. With several TP ranks every decision that depends on timing (is a
read done?) is agreed by an all-reduce, so all ranks admit the same requests.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from typing import TYPE_CHECKING, Optional

import torch

from radixlm.radix_cache import HostTierIndex, MatchResult, PagePool, RadixCache, page_digests
from radixlm.srt.distributed import all_reduce_min, all_reduce_min_list
from radixlm.srt.kv_host_pool import HostKVPool
from radixlm.srt.kv_prefetch import PrefetchTask, StoragePrefetcher
from radixlm.srt.kv_storage import BackgroundWriter, FileKVStorage, kv_fingerprint
from radixlm.srt.server_args import ServerArgs

if TYPE_CHECKING:
    from radixlm.managers.kv_manager import KVManager
    from radixlm.managers.schedule_batch import Req
    from radixlm.srt.model_runner import ModelRunner

logger = logging.getLogger(__name__)

STORAGE_FORMAT = 1
STORAGE_MIN_PAGE_SIZE = 16  # below this, the file tier is mostly file-system overhead (SGLang suggests 64)


def default_storage_dir() -> str:
    """``$RADIXLM_CACHE_DIR/hicache`` or ``~/.cache/radixlm/hicache``."""
    root = os.environ.get("RADIXLM_CACHE_DIR") or os.path.join("~", ".cache", "radixlm")
    return os.path.join(os.path.expanduser(root), "hicache")


def model_identity(model_path: str) -> dict[str, object]:
    """What names a model's weights: its config.json digest and the weight files' names and sizes."""
    ident: dict[str, object] = {"path": os.path.abspath(model_path)}
    config = os.path.join(model_path, "config.json")
    if os.path.isfile(config):
        with open(config, "rb") as f:
            ident["config_blake2b"] = hashlib.blake2b(f.read(), digest_size=16).hexdigest()
    if os.path.isdir(model_path):
        ident["weights"] = sorted((e.name, e.stat().st_size) for e in os.scandir(model_path)
                                  if e.name.endswith((".safetensors", ".bin", ".pt", ".gguf")))
    return ident


class HiCacheController:
    """Host pool, host index and (optional) storage of one TP rank.

    Sizes: the host pool holds ``ceil(device pages * hicache_ratio)`` pages.
    """

    def __init__(self, args: ServerArgs, runner: "ModelRunner") -> None:
        self.args = args
        self.kv_pool = runner.kv_pool
        self.page_size = args.page_size
        self.tp = runner.tp
        mc = runner.model_config
        num_host_pages = max(1, int(-(-runner.page_pool.num_pages * args.hicache_ratio // 1)))
        self.host_pool = HostKVPool(num_host_pages, runner.kv_pool, runner.num_kv_heads, mc.head_dim, runner.dtype)
        self.host_index = HostTierIndex(PagePool(num_host_pages, args.page_size))
        self.write_through = args.hicache_write_policy == "write_through"
        self.storage: Optional[FileKVStorage] = None
        self.writer: Optional[BackgroundWriter] = None
        if args.hicache_storage_backend == "file":
            desc = {"format": STORAGE_FORMAT, "model": model_identity(mc.model_path), "architecture": mc.architecture,
                    "dtype": str(runner.dtype), "page_size": args.page_size, "num_layers": mc.num_hidden_layers,
                    "num_kv_heads": runner.num_kv_heads, "head_dim": mc.head_dim,
                    "tp_rank": runner.tp.rank, "tp_size": runner.tp.size}
            self.storage = FileKVStorage(args.hicache_storage_dir or default_storage_dir(), kv_fingerprint(desc), desc,
                                         self.host_pool.page_bytes, int(args.hicache_storage_max_gb * 2**30))
            if not self.write_through:
                self.writer = BackgroundWriter(self.storage)
        self.prefetch_policy = args.prefetch_policy()
        # Staged pages in flight are capped at the host pool's size (memory of the same order).
        self.prefetcher = StoragePrefetcher(self.storage, num_host_pages) if self.storage is not None else None
        self._prefetch: dict[str, Optional[PrefetchTask]] = {}  # rid of a waiting request -> its read
        self._loading = False  # inserting loaded pages: they are already on host/storage
        self.counters = {"host_saved_pages": 0, "storage_written_pages": 0, "loaded_host_pages": 0,
                         "loaded_storage_pages": 0}
        self.timing = {"save_s": 0.0, "load_s": 0.0}
        if self.storage is not None and args.page_size < STORAGE_MIN_PAGE_SIZE:
            logger.warning("hierarchical cache: --page-size %d writes one storage file per %d token(s) (%d KiB each); "
                           "use --page-size %d or more for fewer, larger files", args.page_size, args.page_size,
                           self.host_pool.page_bytes // 1024, STORAGE_MIN_PAGE_SIZE)
        logger.info("hierarchical cache: host pool of %d pages (%.1f MiB, %s), storage %s", num_host_pages,
                    num_host_pages * self.host_pool.page_bytes / 2**20, args.hicache_write_policy,
                    self.storage.dir if self.storage else "off")

    # ---- TierListener -----------------------------------------------------------------------------
    def on_insert(self, key: tuple[int, ...], start: int, pages: list[int]) -> None:
        if not self.write_through or self._loading or not pages:
            return
        digests = page_digests(key, self.page_size)[start // self.page_size:]
        self._back_up(digests, list(pages), storage_sync=True)

    def on_evict(self, key: tuple[int, ...], pages: list[int]) -> None:
        digests = page_digests(key, self.page_size)[-len(pages):] if pages else []
        self._back_up(digests, list(pages), storage_sync=False)

    def _back_up(self, digests: list[bytes], pages: list[int], storage_sync: bool) -> None:
        """Copy the device pages not yet on host into the host pool; write the ones storage lacks."""
        t0 = time.perf_counter()
        fresh: dict[int, int] = {}  # host page -> device page (the last claim wins if a page is reused)
        for d, p in zip(digests, pages):
            if d in self.host_index:
                self.host_index.touch([d])
                continue
            hp = self.host_index.add(d)
            if hp is not None:
                fresh[hp] = p
        # A host page evicted by a later add of this batch is handed out again at once (LIFO free
        # list), so keying by host page leaves exactly the live entries.
        if fresh:
            self.host_pool.save(self.kv_pool, list(fresh.values()), list(fresh.keys()))
            self.counters["host_saved_pages"] += len(fresh)
        self._write_storage(digests, pages, storage_sync)
        self.timing["save_s"] += time.perf_counter() - t0

    def _write_storage(self, digests: list[bytes], pages: list[int], sync: bool) -> None:
        """Write the device pages whose files storage lacks or has broken (through the writer thread
        unless ``sync``)."""
        if self.storage is None:
            return
        missing = [(d, p) for d, p in zip(digests, pages) if not self.storage.has_page(d)]
        if not missing:
            return
        data = self.host_pool.gather_device(self.kv_pool, [p for _, p in missing]).to("cpu")
        for (d, _), page in zip(missing, data):
            payload = self.host_pool.page_payload(page)
            if sync or self.writer is None:
                self.storage.put(d, payload)
            else:
                self.writer.submit(d, payload)
        self.counters["storage_written_pages"] += len(missing)

    # ---- background storage reads -------------------------------------------------------------------
    def sync_prefetch(self, kv: "KVManager", waiting: list["Req"]) -> None:
        """Start a storage read for each new fresh request of ``waiting``; drop the reads of requests
        that left the queue without being admitted (aborted). Cheap when nothing is in storage: one
        tree match and one file-existence check per new request."""
        if self.prefetcher is None:
            return
        live = {r.rid for r in waiting}
        for rid in [rid for rid in self._prefetch if rid not in live]:
            self._drop(rid)
        for r in waiting:
            if r.rid not in self._prefetch and r.req_pool_idx is None and r.num_retractions == 0:
                self._prefetch[r.rid] = self._start_read(kv, r)

    def _start_read(self, kv: "KVManager", req: "Req") -> Optional[PrefetchTask]:
        assert self.prefetcher is not None and self.storage is not None
        ps = self.page_size
        key = req.fill_ids[:req.match_limit()]
        n_pages = len(key) // ps
        if n_pages == 0 or kv.tree.disable:
            return None
        digests = page_digests(key[:n_pages * ps], ps)
        i = kv.tree.match_prefix(key).num_tokens // ps
        while i < n_pages and digests[i] in self.host_index:
            i += 1
        if i >= n_pages or not self.storage.contains(digests[i]):
            return None
        return self.prefetcher.submit(i, digests[i:], self.prefetch_policy.deadline(time.monotonic(), len(key)))

    def _drop(self, rid: str) -> Optional[PrefetchTask]:
        task = self._prefetch.pop(rid, None)
        if task is not None:
            assert self.prefetcher is not None
            self.prefetcher.release(task)
        return task

    def held(self, reqs: list["Req"]) -> set[str]:
        """rids of ``reqs`` that the prefetch policy holds back this step (agreed over TP ranks).
        Rank-independent cost: with a storage tier and several ranks, one all-reduce per call."""
        if self.prefetcher is None or not reqs:
            return set()
        t = time.monotonic()
        flags = []
        for r in reqs:
            task = self._prefetch.get(r.rid)
            flags.append(int(task is None or self.prefetch_policy.ready(task, t)))
        flags = all_reduce_min_list(self.tp, flags)
        return {r.rid for r, ok in zip(reqs, flags) if not ok}

    def wait_prefetch(self, rids: set[str], timeout_s: float) -> None:
        """Block up to ``timeout_s`` on one of the held reads (the scheduler has nothing else to run)."""
        for rid in rids:
            task = self._prefetch.get(rid)
            if task is not None:
                task.done.wait(timeout_s)
                return

    # ---- load back ----------------------------------------------------------------------------------
    def load_back(self, kv: "KVManager", key: list[int], m: MatchResult,
                  rid: Optional[str] = None) -> tuple[MatchResult, dict[str, int]]:
        """Extend the device match ``m`` of ``key`` (whose ``last_node`` the caller has locked) with
        pages from the host pool, then storage; returns the new match (locked instead of ``m``) and
        the tokens per tier: ``{"device", "host"[, "storage"]}``.

        Storage pages come from request ``rid``'s background read when it had one (only the pages
        read so far: the rest is recomputed), else they are read here."""
        task = self._drop(rid) if rid is not None else None
        staged = task.staged() if task is not None else None
        ps = self.page_size
        n_pages = len(key) // ps
        dev_pages = m.num_tokens // ps
        details = {"device": m.num_tokens, "host": 0}
        if self.storage is not None:
            details["storage"] = 0
        if dev_pages >= n_pages or kv.tree.disable:
            return m, details
        t0 = time.perf_counter()
        digests = page_digests(key[:n_pages * ps], ps)
        room = (kv.pool.available_size + kv.tree.evictable_size()) // ps
        host_pages: list[int] = []
        i = dev_pages
        while i < n_pages and len(host_pages) < room:
            hp = self.host_index.lookup(digests[i])
            if hp is None:
                break
            host_pages.append(hp)
            i += 1
        parts = [self.host_pool.gather(host_pages)] if host_pages else []
        self.host_index.touch(digests[:i])
        from_storage = 0
        if self.storage is not None:
            while i < n_pages and len(host_pages) + from_storage < room:
                if staged is None:
                    payload = self.storage.get(digests[i])
                else:
                    j = i - task.start  # type: ignore[union-attr]
                    ok = 0 <= j < len(staged) and task.digests[j] == digests[i]  # type: ignore[union-attr]
                    payload = staged[j] if ok else None
                if payload is None:
                    break
                parts.append(self.host_pool.page_from_payload(payload)[None])
                from_storage += 1
                i += 1
        found = len(host_pages) + from_storage
        agreed = all_reduce_min(self.tp, found)  # every TP rank must admit the same tokens
        if agreed == 0:
            return m, details
        new_pages = kv.alloc_pages(agreed)
        if new_pages is None:  # cannot happen: room counted the evictable tokens
            return m, details
        data = torch.cat(parts)[:agreed]
        self.host_pool.load(self.kv_pool, data, new_pages)
        end = (dev_pages + agreed) * ps
        self._loading = True
        try:
            existing = kv.tree.insert(key[:end], m.page_indices + new_pages)
        finally:
            self._loading = False
        assert existing == m.num_tokens, "the device match was locked, so the tree cannot have grown along it"
        m2 = kv.tree.match_prefix(key[:end])
        kv.tree.lock(m2.last_node)
        kv.tree.unlock(m.last_node)
        n_host = min(len(host_pages), agreed)
        details["host"] = n_host * ps
        if self.storage is not None:
            details["storage"] = (agreed - n_host) * ps
        self.counters["loaded_host_pages"] += n_host
        self.counters["loaded_storage_pages"] += agreed - n_host
        self.timing["load_s"] += time.perf_counter() - t0
        return m2, details

    # ---- control and checks -------------------------------------------------------------------------
    def flush_host(self) -> None:
        """Forget the host tier (``/flush_cache``); storage is kept."""
        self.host_index.clear()

    def flush_storage(self) -> int:
        """Delete this fingerprint's page files (after finishing queued writes). Returns how many."""
        if self.storage is None:
            return 0
        if self.writer is not None:
            self.writer.drain()
        return self.storage.flush()

    def drain(self) -> None:
        """Wait for queued storage writes (write_back)."""
        if self.writer is not None:
            self.writer.drain()

    def check_idle(self) -> None:
        """Host pool accounting: every host page free or indexed once.

        Raises:
            RuntimeError: naming the leak.
        """
        try:
            self.host_index.check_invariants()
        except AssertionError as e:
            raise RuntimeError(str(e)) from None
        if self._loading:
            raise RuntimeError("hicache: a load is still marked in progress while idle")
        if self._prefetch:
            raise RuntimeError(f"hicache: storage reads of {len(self._prefetch)} request(s) still tracked while idle")
        if self.prefetcher is not None and self.prefetcher.reserved_pages:
            raise RuntimeError(f"hicache: {self.prefetcher.reserved_pages} prefetch page(s) still reserved while idle")

    def state(self) -> dict[str, float]:
        """Counters for ``InternalState.hicache`` (tokens unless named otherwise)."""
        ps = self.page_size
        out: dict[str, float] = {
            "host_capacity_tokens": self.host_index.capacity_pages * ps,
            "host_used_tokens": self.host_index.used_pages() * ps,
            "host_evicted_tokens": self.host_index.num_evicted * ps,
            "host_saved_tokens": self.counters["host_saved_pages"] * ps,
            "loaded_host_tokens": self.counters["loaded_host_pages"] * ps,
            "loaded_storage_tokens": self.counters["loaded_storage_pages"] * ps,
            "save_seconds": self.timing["save_s"], "load_seconds": self.timing["load_s"],
        }
        if self.storage is not None:
            st = self.storage.stats
            out.update(storage_bytes=self.storage.size_bytes(), storage_files=self.storage.num_files(),
                       storage_written_tokens=self.counters["storage_written_pages"] * ps,
                       storage_hits=st["hits"], storage_skipped_bad=st["skipped_bad"], storage_evicted=st["evicted"])
            if self.prefetcher is not None:
                ps_ = self.prefetcher.stats
                out.update(prefetch_tasks=ps_["tasks"], prefetch_read_tokens=ps_["pages_read"] * ps,
                           prefetch_skipped_full=ps_["skipped_full"])
        return out

    def close(self, tree: "RadixCache") -> None:
        """At shutdown: with ``write_back``, write the pages still only on device (never evicted, such
        as a hot system prompt) to storage, so a restart finds them; finish queued writes and stop the
        writer thread."""
        if self.prefetcher is not None:
            for rid in list(self._prefetch):
                self._drop(rid)
            self.prefetcher.close()
        if self.writer is None:
            return
        stack = list(tree.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            digests = page_digests(tree.full_key(node), self.page_size)[-len(node.value):]
            self._write_storage(digests, node.value, sync=False)
        self.writer.close()
        self.writer = None  # closed: later writes (if any) go straight to storage
