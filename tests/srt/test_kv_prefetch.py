"""Background storage prefetch: reads in prefix order until the first miss, cancels, caps the pages
in flight, and the three admission policies (best_effort, wait_complete, timeout)."""

from __future__ import annotations

import threading

import pytest

from radixlm.srt.kv_prefetch import PrefetchPolicy, PrefetchTask, StoragePrefetcher
from radixlm.srt.server_args import ServerArgs, ServerArgsError
from tests.srt.test_kv_storage import digest, payload, storage


class GatedStorage:
    """A storage whose reads wait for ``gate`` (a test double passed to the prefetcher)."""

    def __init__(self, inner, gate: threading.Event) -> None:
        self.inner, self.gate, self.calls = inner, gate, 0

    def get(self, d: bytes):
        self.calls += 1
        assert self.gate.wait(30), "gate never opened"
        return self.inner.get(d)


def test_reads_in_order_until_the_first_miss(tmp_path):
    s = storage(tmp_path)
    for i in (0, 1, 2, 4):  # page 3 missing
        s.put(digest(i), payload(i))
    pf = StoragePrefetcher(s, max_pages=16)
    task = pf.submit(0, [digest(i) for i in range(6)], deadline=0.0)
    assert task is not None and task.done.wait(10)
    assert task.staged() == [payload(0), payload(1), payload(2)]  # stops at 3: 4 is not a prefix
    assert pf.reserved_pages == 6 and pf.stats["pages_read"] == 3
    pf.release(task)
    assert pf.reserved_pages == 0
    pf.close()


def test_cap_on_pages_in_flight(tmp_path):
    s = storage(tmp_path)
    pf = StoragePrefetcher(s, max_pages=4)
    a = pf.submit(0, [digest(i) for i in range(3)], 0.0)
    assert a is not None
    assert pf.submit(0, [digest(i) for i in range(2)], 0.0) is None  # 3 + 2 > 4
    assert pf.stats["skipped_full"] == 1
    assert pf.submit(0, [], 0.0) is None  # nothing to read
    pf.release(a)
    b = pf.submit(0, [digest(i) for i in range(4)], 0.0)
    assert b is not None and pf.reserved_pages == 4
    pf.release(b)
    pf.close()


def test_cancel_stops_the_read(tmp_path):
    s = storage(tmp_path)
    for i in range(8):
        s.put(digest(i), payload(i))
    gate = threading.Event()
    gated = GatedStorage(s, gate)
    pf = StoragePrefetcher(gated, max_pages=16)  # type: ignore[arg-type]
    task = pf.submit(0, [digest(i) for i in range(8)], 0.0)
    assert task is not None
    pf.release(task)  # before any page is read
    gate.set()
    assert task.done.wait(10)
    assert len(task.staged()) <= 1 and gated.calls <= 1  # at most the read already under way
    pf.close()


def test_policies_decide_when_a_request_may_start():
    pending = PrefetchTask(0, [digest(0)], deadline=100.0)
    finished = PrefetchTask(0, [digest(0)], deadline=100.0)
    finished.done.set()
    best, wait, timeout = (PrefetchPolicy(n) for n in ("best_effort", "wait_complete", "timeout"))
    assert best.ready(pending, now=0.0)
    assert not wait.ready(pending, now=1e9) and wait.ready(finished, now=0.0)
    assert not timeout.ready(pending, now=99.9) and timeout.ready(pending, now=100.0)
    assert timeout.ready(finished, now=0.0)
    # SGLang's defaults: 2 s + 0.1 s per 1024 prompt tokens, at most 30 s.
    assert timeout.deadline(10.0, 2048) == pytest.approx(12.2)
    assert timeout.deadline(0.0, 10**7) == 30.0


def test_server_args_parse_policy_and_extra_config():
    args = ServerArgs(model_path="m", enable_hierarchical_cache=True, hicache_storage_backend="file",
                      hicache_storage_prefetch_policy="wait_complete",
                      hicache_storage_backend_extra_config='{"prefetch_timeout_base": 0.5, "prefetch_timeout_max": 4}')
    args.validate()
    assert args.prefetch_policy() == PrefetchPolicy("wait_complete", timeout_base=0.5, timeout_max=4.0)
    assert ServerArgs(model_path="m").prefetch_policy() == PrefetchPolicy("timeout")


@pytest.mark.parametrize("kw,message", [
    ({"hicache_storage_prefetch_policy": "eager"}, "--hicache-storage-prefetch-policy must be one of"),
    ({"hicache_storage_backend_extra_config": "{"}, "is not JSON"),
    ({"hicache_storage_backend_extra_config": "[1]"}, "must be a JSON object"),
    ({"hicache_storage_backend_extra_config": '{"prefetch_timeout": 1}'}, "unknown key(s) prefetch_timeout"),
    ({"hicache_storage_backend_extra_config": '{"prefetch_timeout_max": -1}'}, "must be a number of seconds"),
    ({"hicache_storage_backend_extra_config": '{"prefetch_timeout_max": true}'}, "must be a number of seconds"),
])
def test_bad_prefetch_options_are_clear_errors(kw, message):
    with pytest.raises(ServerArgsError) as e:
        ServerArgs(model_path="m", enable_hierarchical_cache=True, **kw).validate()
    assert message in str(e.value)
