"""Hierarchical KV cache (issue 18): tiers never change a token, a second visit comes from host memory,
a restart serves from storage, bad page files are skipped, and the idle checks cover the host pool.

Model: stories260K in fp32 (greedy tokens equal transformers'). The device pool is a fraction of the
workload's working set, so the radix tree alone forgets every conversation before its next turn.
"""

from __future__ import annotations

import glob
import logging
import os

import pytest

from radixlm.srt.engine import Engine
from radixlm.srt.server_args import ServerArgs, ServerArgsError
from tests.conftest import STORY_PROMPTS
from tests.engine.reference import hf_greedy
from tests.engine.test_greedy_vs_hf import assert_clean

MAX_NEW = 8
SP = {"temperature": 0, "max_new_tokens": MAX_NEW, "min_new_tokens": MAX_NEW}
POOL = 96  # tokens; the six two-turn conversations below hold ~6 x 60
BASE = {"max_total_tokens": POOL, "dtype": "float32", "grammar_backend": "none"}


@pytest.fixture(scope="module")
def tok(stories_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(stories_path)


@pytest.fixture(scope="module")
def conversations(tok):
    """Six first turns sharing a short opening; each ~20-40 tokens."""
    return [tok.encode(f"Once upon a time, {STORY_PROMPTS[i]}") for i in (3, 6, 9, 11, 13, 17)]


def follow_up(tok, first: list[int], out: list[int]) -> list[int]:
    return first + out + tok.encode(" Then", add_special_tokens=False)


def run_two_turns(engine: Engine, tok, firsts: list[list[int]]) -> tuple[list[dict], list[dict]]:
    """Every conversation's first turn, then every second turn (one request at a time)."""
    one = [engine.generate(input_ids=ids, sampling_params=SP) for ids in firsts]
    two = [engine.generate(input_ids=follow_up(tok, ids, o["output_ids"]), sampling_params=SP)
           for ids, o in zip(firsts, one)]
    return one, two


def details(out: dict) -> dict:
    return out["meta_info"]["cached_tokens_details"]


@pytest.fixture(scope="module")
def tiers_off(stories_path, tok, conversations):
    engine = Engine(stories_path, page_size=4, **BASE)
    one, two = run_two_turns(engine, tok, conversations)
    assert_clean(engine)
    return one, two


@pytest.mark.parametrize("page_size,policy", [(4, "write_back"), (1, "write_through")])
def test_second_visit_served_from_host_with_identical_tokens(stories_path, tok, conversations, tiers_off,
                                                             page_size, policy):
    engine = Engine(stories_path, page_size=page_size, enable_hierarchical_cache=True, hicache_ratio=8,
                    hicache_write_policy=policy, **BASE)
    one, two = run_two_turns(engine, tok, conversations)
    off_one, off_two = tiers_off
    assert [o["output_ids"] for o in one] == [o["output_ids"] for o in off_one]
    assert [o["output_ids"] for o in two] == [o["output_ids"] for o in off_two]
    # ... and equal transformers' on the second turn (the turn that reads loaded KV).
    seconds = [follow_up(tok, ids, o["output_ids"]) for ids, o in zip(conversations, one)]
    assert [o["output_ids"] for o in two] == hf_greedy(stories_path, tuple(map(tuple, seconds)), MAX_NEW)
    for ids, first, second, off in zip(conversations, one, two, off_two):
        meta, d = second["meta_info"], details(second)
        assert set(d) == {"device", "host"} and sum(d.values()) == meta["cached_tokens"]
        # The whole first turn (prompt + output but the last token) is reused ...
        assert meta["cached_tokens"] == (len(ids) + MAX_NEW - 1) // page_size * page_size
        # ... mostly from the host tier, where the radix tree alone had forgotten it.
        assert d["host"] > d["device"], d
        assert off["meta_info"]["cached_tokens"] < meta["cached_tokens"]
    state = engine.scheduler.internal_state().hicache
    assert state["cached_tokens_host"] == sum(details(o)["host"] for o in one + two)
    assert state["cached_tokens_device"] == sum(details(o)["device"] for o in one + two)
    assert state["loaded_host_tokens"] >= state["cached_tokens_host"]
    assert 0 < state["host_used_tokens"] <= state["host_capacity_tokens"] == POOL // page_size * page_size * 8
    engine.scheduler.kv.check_idle()  # device invariant + host pool accounting
    assert_clean(engine)
    assert engine.scheduler.internal_state().hicache["host_used_tokens"] == 0  # /flush_cache flushes host


def test_batch_with_retraction_equals_hf(stories_path, tok):
    prompts = [tok.encode(p) for p in STORY_PROMPTS]
    expected = hf_greedy(stories_path, tuple(map(tuple, prompts)), MAX_NEW)
    engine = Engine(stories_path, page_size=4, enable_hierarchical_cache=True, hicache_ratio=4,
                    **{**BASE, "max_total_tokens": 200})
    for _ in range(2):  # the second pass loads evicted prefixes back while other requests run
        outs = engine.generate(input_ids=prompts, sampling_params=SP)
        assert [o["output_ids"] for o in outs] == expected
    assert engine.scheduler.internal_state().hicache["loaded_host_tokens"] > 0
    assert_clean(engine)


def storage_engine(stories_path, directory, **kw) -> Engine:
    return Engine(stories_path, page_size=4, enable_hierarchical_cache=True, hicache_storage_backend="file",
                  hicache_storage_dir=str(directory), **{**BASE, **kw})


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_restart_serves_repeated_prompt_from_storage(stories_path, tok, conversations, tmp_path, policy):
    first = storage_engine(stories_path, tmp_path, hicache_write_policy=policy)
    outs = [first.generate(input_ids=ids, sampling_params=SP) for ids in conversations]
    first.shutdown()  # write_back: writes what is only on device (the shared opening), waits for the writes
    again = storage_engine(stories_path, tmp_path, hicache_write_policy=policy)
    ids = conversations[0]
    out = again.generate(input_ids=ids, sampling_params=SP)
    assert out["output_ids"] == outs[0]["output_ids"]
    full = (len(ids) - 1) // 4 * 4
    assert details(out) == {"device": 0, "host": 0, "storage": full}
    assert out["meta_info"]["cached_tokens"] == full
    assert_clean(again)
    again.shutdown()


def test_replicas_share_the_storage_folder(stories_path, conversations, tmp_path):
    a, b = storage_engine(stories_path, tmp_path), storage_engine(stories_path, tmp_path)  # two dp replicas
    ids = conversations[5]
    expected = a.generate(input_ids=ids, sampling_params=SP)["output_ids"]
    out = b.generate(input_ids=ids, sampling_params=SP)  # b never saw it: a's pages, from storage
    assert out["output_ids"] == expected
    assert details(out) == {"device": 0, "host": 0, "storage": (len(ids) - 1) // 4 * 4}
    assert_clean(a)
    assert_clean(b)


def page_files(directory) -> list[str]:
    return sorted(glob.glob(os.path.join(str(directory), "*", "*", "*.kvpage")))


def test_bad_storage_files_are_skipped_and_recomputed(stories_path, tok, conversations, tmp_path, caplog):
    ids = conversations[2]
    first = storage_engine(stories_path, tmp_path, max_total_tokens=400)
    expected = first.generate(input_ids=ids, sampling_params=SP)["output_ids"]
    first.shutdown()
    files = page_files(tmp_path)
    assert len(files) >= (len(ids) + MAX_NEW - 1) // 4
    # Damage every file one way or another: flipped payload byte, truncation, foreign fingerprint.
    for k, path in enumerate(files):
        data = bytearray(open(path, "rb").read())
        if k % 3 == 0:
            data[-1] ^= 0x55
        elif k % 3 == 1:
            data = data[: len(data) // 2]
        else:
            data[8:24] = bytes(16)
        open(path, "wb").write(bytes(data))
    again = storage_engine(stories_path, tmp_path, max_total_tokens=400)
    with caplog.at_level(logging.WARNING, logger="radixlm.srt.kv_storage"):
        out = again.generate(input_ids=ids, sampling_params=SP)
    assert out["output_ids"] == expected
    assert details(out)["storage"] == 0  # the first page's file was bad: nothing loads, all recomputed
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "recomputed" in messages
    assert again.scheduler.internal_state().hicache["storage_skipped_bad"] >= 1
    # The recompute rewrote every truncated or foreign file (only flipped payloads wait for a read).
    storage = again.scheduler.hicache.storage
    for k, path in enumerate(files):
        if k % 3:
            assert storage.has_page(bytes.fromhex(os.path.basename(path).split(".")[0])), path
    # Recomputed pages replace bad files (truncated and foreign ones at once, a corrupted payload once
    # it is read), so repeated visits heal the storage; every visit's tokens stay right.
    full = (len(ids) - 1) // 4 * 4
    loaded = []
    for _ in range(len(files)):
        assert again.flush_cache()
        out = again.generate(input_ids=ids, sampling_params=SP)
        assert out["output_ids"] == expected
        loaded.append(details(out)["storage"])
        if loaded[-1] == full:
            break
    assert loaded[-1] == full and loaded == sorted(loaded), loaded
    assert_clean(again)


def test_partly_bad_storage_loads_the_good_prefix(stories_path, conversations, tmp_path, caplog):
    ids = conversations[4]
    first = storage_engine(stories_path, tmp_path, max_total_tokens=400)
    expected = first.generate(input_ids=ids, sampling_params=SP)["output_ids"]
    n_pages = (len(ids) - 1) // 4
    # Truncate the file of page 5 of the prompt: pages 0-4 load, the rest is recomputed.
    from radixlm.radix_cache import page_digests

    digest = page_digests(ids, 4)[5]
    victim = first.scheduler.hicache.storage.path(digest)
    first.shutdown()
    with open(victim, "r+b") as f:
        f.truncate(100)
    again = storage_engine(stories_path, tmp_path, max_total_tokens=400)
    with caplog.at_level(logging.WARNING, logger="radixlm.srt.kv_storage"):
        out = again.generate(input_ids=ids, sampling_params=SP)
    assert out["output_ids"] == expected
    assert details(out) == {"device": 0, "host": 0, "storage": 5 * 4} and n_pages > 5
    assert "truncated" in caplog.text


def test_flushes_host_and_storage_separately(stories_path, conversations, tmp_path):
    engine = storage_engine(stories_path, tmp_path)
    ids = conversations[1]
    expected = engine.generate(input_ids=ids, sampling_params=SP)["output_ids"]
    full = (len(ids) - 1) // 4 * 4
    assert engine.flush_cache()  # device and host
    assert engine.scheduler.internal_state().hicache["host_used_tokens"] == 0
    out = engine.generate(input_ids=ids, sampling_params=SP)
    assert out["output_ids"] == expected and details(out) == {"device": 0, "host": 0, "storage": full}
    assert engine.flush_cache() and engine.clear_hicache_storage()
    assert page_files(tmp_path) == [] and engine.scheduler.internal_state().hicache["storage_files"] == 0
    out = engine.generate(input_ids=ids, sampling_params=SP)
    assert out["output_ids"] == expected and out["meta_info"]["cached_tokens"] == 0
    assert_clean(engine)


def test_idle_check_covers_host_pool(stories_path, conversations):
    engine = Engine(stories_path, page_size=4, enable_hierarchical_cache=True, **BASE)
    for ids in conversations[:4]:
        engine.generate(input_ids=ids, sampling_params=SP)
    engine.scheduler.kv.check_idle()
    engine.scheduler.hicache.host_index.pool.alloc(1)  # a host page taken behind the index
    with pytest.raises(RuntimeError, match="host pool leak"):
        engine.scheduler.kv.check_idle()


def test_tiers_off_reports_no_details(stories_path, conversations):
    engine = Engine(stories_path, **BASE)
    out = engine.generate(input_ids=conversations[0], sampling_params=SP)
    assert "cached_tokens_details" not in out["meta_info"]
    assert engine.scheduler.internal_state().hicache == {}
    assert not engine.clear_hicache_storage()


@pytest.mark.parametrize("kwargs,message", [
    ({"hicache_storage_backend": "file"}, "needs --enable-hierarchical-cache"),
    ({"enable_hierarchical_cache": True, "disable_radix_cache": True}, "needs the radix cache"),
    ({"enable_hierarchical_cache": True, "hicache_ratio": 0}, "--hicache-ratio"),
    ({"enable_hierarchical_cache": True, "hicache_write_policy": "write_around"}, "--hicache-write-policy"),
    ({"enable_hierarchical_cache": True, "hicache_storage_backend": "s3"}, "--hicache-storage-backend"),
])
def test_bad_flags(kwargs, message):
    with pytest.raises(ServerArgsError, match=message):
        ServerArgs(**kwargs).validate()
