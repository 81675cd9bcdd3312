"""The file storage tier: atomic page files, validation on read, LRU size cap, flush, write-back thread."""

from __future__ import annotations

import logging
import os
import shutil

import pytest

from radixlm.srt.kv_storage import HEADER_SIZE, BackgroundWriter, FileKVStorage, kv_fingerprint

PAGE = 64
DESC = {"model": "m", "dtype": "float32", "page_size": 4}


def storage(root, desc=DESC, max_bytes=1 << 20) -> FileKVStorage:
    return FileKVStorage(str(root), kv_fingerprint(desc), desc, PAGE, max_bytes)


def payload(i: int) -> bytes:
    return bytes((i + k) % 256 for k in range(PAGE))


def digest(i: int) -> bytes:
    return i.to_bytes(16, "big")  # one subfolder for all


def test_put_get_roundtrip_and_reopen(tmp_path):
    s = storage(tmp_path)
    assert s.put(digest(1), payload(1))
    assert not s.put(digest(1), payload(1))  # already there
    assert s.get(digest(1)) == payload(1)
    assert s.get(digest(2)) is None
    assert s.num_files() == 1 and s.size_bytes() == PAGE + HEADER_SIZE
    # A new process (restart, or another replica) sees the same files.
    again = storage(tmp_path)
    assert again.num_files() == 1 and again.get(digest(1)) == payload(1)
    assert not [n for n in os.listdir(os.path.dirname(s.path(digest(1)))) if ".tmp" in n]


def test_fingerprint_separates_layouts(tmp_path):
    a = storage(tmp_path)
    b = storage(tmp_path, {**DESC, "page_size": 8})
    a.put(digest(1), payload(1))
    assert b.get(digest(1)) is None and not b.contains(digest(1))
    assert a.dir != b.dir


def _expect_skip(s, d, caplog, what):
    with caplog.at_level(logging.WARNING, logger="radixlm.srt.kv_storage"):
        assert s.get(d) is None
    assert any(what in r.getMessage() and "recomputed" in r.getMessage() for r in caplog.records), caplog.text
    assert not os.path.exists(s.path(d))  # deleted, so it is rewritten next time
    assert s.stats["skipped_bad"] >= 1


def test_corrupted_payload_is_skipped_with_a_warning(tmp_path, caplog):
    s = storage(tmp_path)
    s.put(digest(1), payload(1))
    path = s.path(digest(1))
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 0xFF
    open(path, "wb").write(bytes(data))
    _expect_skip(s, digest(1), caplog, "checksum")
    assert s.num_files() == 0
    assert s.put(digest(1), payload(1)) and s.get(digest(1)) == payload(1)


@pytest.mark.parametrize("cut", [10, HEADER_SIZE + 5])
def test_truncated_file_is_skipped(tmp_path, caplog, cut):
    s = storage(tmp_path)
    s.put(digest(1), payload(1))
    path = s.path(digest(1))
    data = open(path, "rb").read()
    open(path, "wb").write(data[:cut])
    _expect_skip(s, digest(1), caplog, "truncated")


def test_foreign_file_is_skipped(tmp_path, caplog):
    mine = storage(tmp_path)
    other = storage(tmp_path, {**DESC, "model": "other"})
    other.put(digest(1), payload(1))
    os.makedirs(os.path.dirname(mine.path(digest(1))), exist_ok=True)
    shutil.copy(other.path(digest(1)), mine.path(digest(1)))  # a file of another model in our folder
    assert mine.contains(digest(1))
    _expect_skip(mine, digest(1), caplog, "foreign fingerprint")


def test_file_of_another_prefix_and_garbage_are_skipped(tmp_path, caplog):
    s = storage(tmp_path)
    s.put(digest(1), payload(1))
    shutil.copy(s.path(digest(1)), s.path(digest(2)))
    _expect_skip(s, digest(2), caplog, "another prefix")
    with open(s.path(digest(3)), "wb") as f:
        f.write(b"x" * (PAGE + HEADER_SIZE))
    _expect_skip(s, digest(3), caplog, "bad magic")
    assert s.get(digest(1)) == payload(1)


def test_put_replaces_a_bad_file_but_keeps_a_good_one(tmp_path):
    s = storage(tmp_path)
    s.put(digest(1), payload(1))
    assert not s.put(digest(1), payload(2))  # a valid file stays
    path = s.path(digest(1))
    with open(path, "r+b") as f:
        f.truncate(HEADER_SIZE + 3)
    assert s.put(digest(1), payload(1)) and s.get(digest(1)) == payload(1)
    data = bytearray(open(path, "rb").read())
    data[8:24] = bytes(16)  # foreign fingerprint
    open(path, "wb").write(bytes(data))
    assert s.put(digest(1), payload(1)) and s.get(digest(1)) == payload(1)


def test_wrong_payload_size_is_refused(tmp_path):
    with pytest.raises(ValueError):
        storage(tmp_path).put(digest(1), b"short")


def test_size_cap_evicts_least_recently_used(tmp_path):
    file_bytes = PAGE + HEADER_SIZE
    s = storage(tmp_path, max_bytes=3 * file_bytes)
    for i in range(3):
        s.put(digest(i), payload(i))
    assert s.get(digest(0)) == payload(0)  # page 0 is now the most recent
    s.put(digest(3), payload(3))
    assert s.num_files() == 3 and s.size_bytes() == 3 * file_bytes
    assert not s.contains(digest(1))  # the least recently used went
    assert all(s.contains(digest(i)) for i in (0, 2, 3))
    assert s.stats["evicted"] == 1
    # Reopening with a smaller cap trims at start.
    small = storage(tmp_path, max_bytes=file_bytes)
    assert small.num_files() == 1


def test_flush_deletes_every_page_file(tmp_path):
    s = storage(tmp_path)
    for i in range(5):
        s.put(digest(i), payload(i))
    assert s.flush() == 5
    assert s.num_files() == 0 and not any(s.contains(digest(i)) for i in range(5))
    assert os.path.exists(os.path.join(s.dir, "fingerprint.json"))


def test_background_writer_drains_and_closes(tmp_path):
    s = storage(tmp_path)
    w = BackgroundWriter(s)
    for i in range(20):
        w.submit(digest(i), payload(i))
    w.drain()
    assert s.num_files() == 20 and s.get(digest(7)) == payload(7)
    w.submit(digest(99), b"bad size")  # a failed write is logged, the thread lives on
    w.submit(digest(21), payload(21))
    w.close()
    assert s.get(digest(21)) == payload(21) and not s.contains(digest(99))
