"""Storage reads in the background (issue 18): a request whose prefix is being read from storage waits
while other requests run, each ``--hicache-storage-prefetch-policy`` admits it when it should, and the
tokens never change.

Model: stories260K in fp32; the storage is filled by a first engine, then read by a "restarted" one.
"""

from __future__ import annotations

import threading
import time

import pytest

from radixlm.srt.kv_prefetch import StoragePrefetcher
from tests.engine.test_greedy_vs_hf import assert_clean
from tests.engine.test_hicache import SP, conversations, details, storage_engine, tok  # noqa: F401 (fixtures)
from tests.srt.test_kv_prefetch import GatedStorage


@pytest.fixture(scope="module")
def filled(stories_path, conversations, tmp_path_factory):  # noqa: F811
    """A storage folder holding every conversation's first turn, and those turns' outputs."""
    root = tmp_path_factory.mktemp("hicache_storage")
    first = storage_engine(stories_path, root)
    outs = [first.generate(input_ids=ids, sampling_params=SP)["output_ids"] for ids in conversations]
    first.shutdown()
    return root, outs


def full_pages(ids: list[int]) -> int:
    return (len(ids) - 1) // 4 * 4


@pytest.mark.parametrize("policy", ["best_effort", "wait_complete", "timeout"])
def test_each_policy_keeps_tokens_and_reads_in_the_background(stories_path, conversations, filled, policy):  # noqa: F811
    root, outs = filled
    engine = storage_engine(stories_path, root, hicache_storage_prefetch_policy=policy)
    ids = conversations[2]
    out = engine.generate(input_ids=ids, sampling_params=SP)
    assert out["output_ids"] == outs[2]
    state = engine.scheduler.internal_state().hicache
    assert state["prefetch_tasks"] == 1  # read by the prefetch thread, not at admission
    d = details(out)
    if policy == "best_effort":  # admitted at once, with what was read by then
        assert d["device"] == d["host"] == 0 and 0 <= d["storage"] <= full_pages(ids)
    else:
        assert d == {"device": 0, "host": 0, "storage": full_pages(ids)}
        assert state["prefetch_read_tokens"] == full_pages(ids)
    assert_clean(engine)
    engine.shutdown()


def gate_storage(engine) -> threading.Event:
    """Route the engine's storage reads through a gate that the test opens."""
    gate = threading.Event()
    hc = engine.scheduler.hicache
    hc.prefetcher.close()
    hc.prefetcher = StoragePrefetcher(GatedStorage(hc.storage, gate), hc.prefetcher.max_pages)
    return gate


def test_a_request_waiting_for_storage_does_not_hold_up_others(stories_path, conversations, filled):  # noqa: F811
    root, outs = filled
    engine = storage_engine(stories_path, root, hicache_storage_prefetch_policy="wait_complete")
    gate = gate_storage(engine)
    stored, fresh = conversations[0], [1] + conversations[1][1:][::-1]  # the second is in no tier
    results: dict = {}
    worker = threading.Thread(target=lambda: results.update(
        outs=engine.generate(input_ids=[stored, fresh], sampling_params=SP)))
    worker.start()
    deadline = time.monotonic() + 60
    # The fresh request decodes to the end while the stored one is held (its read is gated).
    while engine.scheduler.stats["generation_tokens"] < SP["max_new_tokens"] and time.monotonic() < deadline:
        time.sleep(0.01)
    held_while_other_ran = engine.scheduler.stats["generation_tokens"] == SP["max_new_tokens"]
    gate.set()
    worker.join(60)
    assert held_while_other_ran, "the other request did not run while the storage read was pending"
    a, b = results["outs"]
    assert a["output_ids"] == outs[0] and details(a) == {"device": 0, "host": 0, "storage": full_pages(stored)}
    assert details(b)["storage"] == 0
    assert_clean(engine)
    engine.shutdown()


def test_timeout_admits_a_request_whose_read_is_stuck(stories_path, conversations, filled):  # noqa: F811
    root, outs = filled
    engine = storage_engine(stories_path, root, hicache_storage_prefetch_policy="timeout",
                            hicache_storage_backend_extra_config='{"prefetch_timeout_base": 0.3, '
                                                                 '"prefetch_timeout_per_ki_token": 0}')
    gate = gate_storage(engine)
    try:
        t0 = time.monotonic()
        out = engine.generate(input_ids=conversations[4], sampling_params=SP)
        waited = time.monotonic() - t0
    finally:
        gate.set()
    assert out["output_ids"] == outs[4]  # recomputed: same tokens
    assert details(out)["storage"] == 0  # nothing was read by the deadline
    assert waited >= 0.3  # it did wait for the read first
    assert_clean(engine)
    engine.shutdown()
