"""ZMQ helpers (managers/ipc.py) and the detokenizer process built on them."""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import os
import signal
import time

import msgspec
import pytest
import zmq

from radixlm.managers import io_struct as io
from radixlm.managers.detokenizer_manager import run_detokenizer_process
from radixlm.managers.ipc import AsyncPullReceiver, IpcPaths, PullReceiver, PushSender
from radixlm.srt.sampling_params import SamplingParams



def _token_out(rid: str = "r1", ids: list[int] | None = None, finish=None) -> io.BatchTokenOut:
    return io.BatchTokenOut(
        rids=[rid],
        output_ids=[ids if ids is not None else [317, 352]],
        finished_reasons=[finish],
        prompt_tokens=[4],
        completion_tokens=[2],
        cached_tokens=[1],
        skip_special_tokens=[True],
        spaces_between_special_tokens=[True],
        no_stop_trim=[False],
        include_stop_str=[False],
        stop_strs=[["END"]],
        input_tail_ids=[[1, 5]],
        output_token_logprobs=[[-0.5, -1.25]],
        output_top_logprobs=[[[(-0.5, 317)], [(-1.25, 352), (-2.0, 3)]]],
        input_token_logprobs=[[None, -3.0]],
        input_token_ids=[[1, 5]],
        input_top_logprobs=[[None, [(-3.0, 5)]]],
        num_retractions=[0],
    )


ALL_MESSAGES = [
    io.TokenizedGenerateReq(
        rid="a", input_ids=[1, 2, 3], sampling_params=SamplingParams(stop=["x"]), stream=True
    ),
    io.AbortReq(rid="a"),
    io.AbortReq(abort_all=True, message="bye"),
    io.FlushCacheReq(),
    io.FlushCacheOut(success=False, message="busy"),
    io.GetInternalStateReq(),
    io.InternalState(
        max_total_num_tokens=100, available_size=90, evictable_size=5, protected_size=5,
        num_running_reqs=1, num_waiting_reqs=2, num_retractions=0, num_prompt_tokens=7,
        num_generation_tokens=8, num_cached_tokens=3, page_size=1, context_len=512,
    ),
    _token_out(finish=io.FinishReason(type="stop", matched=2)),
    io.BatchStrOut(
        token_out=_token_out(finish=io.FinishReason(type="abort", message="m", status_code=400)),
        output_strs=["Lily"],
    ),
]


def _message_types() -> set[type]:
    return set(io.Message.__args__)  # type: ignore[attr-defined]


def test_fixture_covers_every_message_type():
    assert {type(m) for m in ALL_MESSAGES} == _message_types()


@pytest.fixture
def paths():
    p = IpcPaths.in_new_tempdir()
    yield p
    p.remove()


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.term()


def test_paths_in_new_tempdir(paths):
    assert os.path.isdir(paths.root)
    assert str(os.getpid()) in os.path.basename(paths.root)
    endpoints = [paths.scheduler_input, paths.detokenizer_input, paths.tokenizer_input,
                 paths.scheduler_rpc]
    assert len(set(endpoints)) == 4
    for ep in endpoints:
        assert ep.startswith("ipc://" + paths.root + os.sep)
    with pytest.raises(dataclasses.FrozenInstanceError):
        paths.root = "/elsewhere"  # type: ignore[misc]
    other = IpcPaths.in_new_tempdir()
    assert other.root != paths.root
    other.remove()
    assert not os.path.exists(other.root)


def test_paths_too_long_raise(tmp_path):
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    with pytest.raises(ValueError, match="longer than"):
        IpcPaths.in_dir(str(deep))


@pytest.mark.parametrize("push_binds", [True, False])
def test_round_trip_every_message(ctx, paths, push_binds):
    with PushSender(ctx, paths.scheduler_input, bind=push_binds) as push, PullReceiver(
        ctx, paths.scheduler_input, bind=not push_binds
    ) as pull:
        for msg in ALL_MESSAGES:
            push.send(msg)
        got = [pull.recv(timeout_ms=5000) for _ in ALL_MESSAGES]
    assert got == ALL_MESSAGES
    assert [type(m) for m in got] == [type(m) for m in ALL_MESSAGES]


def test_recv_timeout_returns_none(ctx, paths):
    with PullReceiver(ctx, paths.tokenizer_input, bind=True) as pull:
        t0 = time.monotonic()
        assert pull.recv(timeout_ms=50) is None
        assert 0.04 <= time.monotonic() - t0 < 2.0
        assert pull.recv_all_nowait() == []
        assert isinstance(pull.fileno(), int) and pull.fileno() >= 0


def test_recv_all_nowait_drains_in_order(ctx, paths):
    with PullReceiver(ctx, paths.detokenizer_input, bind=True) as pull, PushSender(
        ctx, paths.detokenizer_input, bind=False
    ) as push:
        sent = [io.AbortReq(rid=str(i)) for i in range(5)]
        for m in sent:
            push.send(m)
        got = [pull.recv(timeout_ms=5000)]
        deadline = time.monotonic() + 5
        while len(got) < len(sent) and time.monotonic() < deadline:
            got += pull.recv_all_nowait()
        assert got == sent
        assert pull.recv_all_nowait() == []


def test_unknown_tag_and_garbage_raise(ctx, paths):
    raw = ctx.socket(zmq.PUSH)
    raw.setsockopt(zmq.LINGER, 0)
    with PullReceiver(ctx, paths.scheduler_input, bind=True) as pull:
        raw.connect(paths.scheduler_input)
        raw.send(msgspec.msgpack.encode({"type": "ShutdownEverything", "rid": "x"}))
        with pytest.raises(msgspec.ValidationError):
            pull.recv(timeout_ms=5000)
        raw.send(b"\xc1 not msgpack")
        with pytest.raises(msgspec.DecodeError):
            pull.recv(timeout_ms=5000)
        raw.send(io.encode(io.FlushCacheReq()))  # the socket still works afterwards
        assert pull.recv(timeout_ms=5000) == io.FlushCacheReq()
    raw.close()


def test_close_is_idempotent_and_does_not_linger(ctx, paths):
    # A connected PUSH with no peer queues frames; linger 0 lets close + term return at once.
    push = PushSender(ctx, paths.scheduler_rpc, bind=False)
    push.send(io.FlushCacheReq())
    push.close()
    push.close()
    assert push.socket.closed


def test_bad_endpoint_raises(ctx, tmp_path):
    with pytest.raises(zmq.ZMQError):
        PullReceiver(ctx, f"ipc://{tmp_path}/missing-dir/sock", bind=True)


def test_async_pull_receiver(ctx, paths):
    async def main() -> list[io.Message]:
        with AsyncPullReceiver(ctx, paths.tokenizer_input, bind=True) as pull, PushSender(
            ctx, paths.tokenizer_input, bind=False
        ) as push:
            assert pull.recv_all_nowait() == []
            for m in ALL_MESSAGES:
                push.send(m)
            got = [await asyncio.wait_for(pull.recv(), timeout=5)]
            deadline = time.monotonic() + 5
            while len(got) < len(ALL_MESSAGES) and time.monotonic() < deadline:
                more = pull.recv_all_nowait()
                got += more or [await asyncio.wait_for(pull.recv(), timeout=5)]
            return got

    assert asyncio.run(main()) == ALL_MESSAGES


def test_no_pickle_in_ipc():
    import radixlm.managers.ipc as ipc

    with open(ipc.__file__, encoding="utf-8") as f:
        src = f.read()
    assert "pickle" not in src.replace("No pickle", "").replace("no pickle", "")
    assert "pyobj" not in src


# ---------------------------------------------------------------- detokenizer process


def _start(tokenizer_path: str, paths: IpcPaths):
    mp = multiprocessing.get_context("spawn")
    reader, writer = mp.Pipe(duplex=False)
    proc = mp.Process(target=run_detokenizer_process, args=(tokenizer_path, paths, writer))
    proc.start()
    writer.close()
    return proc, reader


def test_detokenizer_process_round_trip_and_sigterm(ctx, paths, stories_path):
    with PullReceiver(ctx, paths.tokenizer_input, bind=True) as out:
        proc, reader = _start(stories_path, paths)
        try:
            assert reader.poll(60), "detokenizer did not report ready"
            assert reader.recv() == "ready"
            with PushSender(ctx, paths.detokenizer_input, bind=False) as push:
                push.send(_token_out("r1", [317, 352, 303]))
                push.send(_token_out("r1", [410, 459], io.FinishReason(type="length", length=5)))
                first = out.recv(timeout_ms=10000)
                second = out.recv(timeout_ms=10000)
            assert isinstance(first, io.BatchStrOut) and isinstance(second, io.BatchStrOut)
            assert first.output_strs == ["Lily ran"]
            assert second.output_strs == [" E"]  # held-back "E" (prefix of "END") flushed at finish
            assert second.token_out.finished_reasons[0].type == "length"
            os.kill(proc.pid, signal.SIGTERM)
            proc.join(10)
            assert proc.exitcode == 0
        finally:
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def test_detokenizer_process_reports_crash(tmp_path):
    # An endpoint in a missing directory: binding fails before the tokenizer is even loaded.
    bad = IpcPaths.in_dir(str(tmp_path / "missing"))
    proc, reader = _start(str(tmp_path / "no-such-model"), bad)
    try:
        assert reader.poll(60)
        msg = reader.recv()
        assert msg.startswith("error: ") and "ZMQError" in msg
        proc.join(20)
        assert proc.exitcode == 1
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(5)
