"""DataParallelController over real ZMQ sockets, with plain PULL/PUSH sockets standing in for two
scheduler replicas: routing, load accounting, abort routing, control fan-out, merged states."""

from __future__ import annotations

import asyncio

import pytest
import zmq

from radixlm.managers.data_parallel_controller import DataParallelController, merge_internal_states
from radixlm.managers.io_struct import (AbortReq, FlushCacheOut, FlushCacheReq, GetInternalStateReq, InternalState,
                                        TokenizedGenerateReq)
from radixlm.managers.ipc import IpcPaths, PullReceiver, PushSender
from radixlm.managers.load_balance import RoundRobin
from radixlm.srt.sampling_params import SamplingParams


def _req(rid: str, ids=(1, 2, 3)) -> TokenizedGenerateReq:
    return TokenizedGenerateReq(rid=rid, input_ids=list(ids), sampling_params=SamplingParams(max_new_tokens=1))


def _state(**kw) -> InternalState:
    base = dict(max_total_num_tokens=100, available_size=90, evictable_size=5, protected_size=0, num_running_reqs=1,
                num_waiting_reqs=0, num_retractions=0, num_prompt_tokens=10, num_generation_tokens=4,
                num_cached_tokens=3, page_size=1, context_len=512, attention_backend="cpu")
    return InternalState(**{**base, **kw})


@pytest.fixture
def rig(tmp_path):
    """(controller, [replica PULL], [replica PUSH to the rpc socket]) for two replicas."""
    ctx = zmq.Context()
    paths = IpcPaths.in_dir(str(tmp_path))
    replicas = [paths.for_dp_rank(r, 2) for r in range(2)]
    assert len({p.scheduler_input for p in replicas}) == 2
    assert {p.detokenizer_input for p in replicas} == {paths.detokenizer_input}
    inputs = [PullReceiver(ctx, p.scheduler_input, bind=True) for p in replicas]
    dp = DataParallelController(ctx, replicas, RoundRobin(2))
    replies = [PushSender(ctx, p.scheduler_rpc, bind=False) for p in replicas]
    yield dp, inputs, replies
    dp.close()
    for s in (*inputs, *replies):
        s.close()
    ctx.term()


def _drain(inputs: list[PullReceiver]) -> list[list]:
    return [[m for m in (r.recv(timeout_ms=200),) if m is not None] + r.recv_all_nowait() for r in inputs]


def test_routes_counts_load_and_aborts_the_owner(rig):
    dp, inputs, _ = rig
    assert [dp.dispatch(_req(f"r{i}")) for i in range(3)] == [0, 1, 0]
    assert dp.dispatch(_req("pinned"), dp_rank=1) == 1
    got = _drain(inputs)
    assert [[m.rid for m in ms] for ms in got] == [["r0", "r2"], ["r1", "pinned"]]
    assert dp.loads == [2, 2] and dp.routed == [2, 2]
    dp.on_finished("r0")
    dp.on_finished("r0")  # a second terminal output for a rid is not counted twice
    assert dp.loads == [1, 2]
    dp.abort(AbortReq(rid="r1", exact=True))  # the owner only
    dp.abort(AbortReq(rid="r", exact=False))  # a prefix: everyone
    dp.abort(AbortReq(rid="gone", exact=True))  # unknown (finished): everyone
    got = _drain(inputs)
    assert [[(m.rid, m.exact) for m in ms] for ms in got] == [[("r", False), ("gone", True)],
                                                            [("r1", True), ("r", False), ("gone", True)]]
    with pytest.raises(ValueError, match="data_parallel_rank"):
        dp.dispatch(_req("x"), dp_rank=2)
    assert dp.replica_stats() == [{"dp_rank": 0, "load": 1, "num_routed_reqs": 2},
                                  {"dp_rank": 1, "load": 2, "num_routed_reqs": 2}]


def test_control_fans_out_and_gathers_in_replica_order(rig):
    dp, inputs, replies = rig

    async def main():
        dp.start()
        futures = dp.control(FlushCacheReq(), FlushCacheOut)
        got = _drain(inputs)
        assert [[type(m) for m in ms] for ms in got] == [[FlushCacheReq], [FlushCacheReq]]
        replies[1].send(FlushCacheOut(success=False, message="busy"))  # replica 1 answers first
        replies[0].send(FlushCacheOut(success=True))
        outs = await asyncio.wait_for(asyncio.gather(*futures), 5)
        assert [o.success for o in outs] == [True, False]
        futures = dp.control(GetInternalStateReq(), InternalState)
        dp.fail_pending(RuntimeError("replica gone"))
        for fut in futures:
            with pytest.raises(RuntimeError, match="replica gone"):
                await fut

    asyncio.run(main())


def test_merge_internal_states_sums_counts_and_keeps_settings():
    a = _state(hicache={"host_used_tokens": 4})
    b = _state(max_total_num_tokens=50, num_cached_tokens=7, hicache={"host_used_tokens": 1, "storage_files": 2})
    m = merge_internal_states([a, b])
    assert m.max_total_num_tokens == 150 and m.num_cached_tokens == 10 and m.num_running_reqs == 2
    assert m.page_size == 1 and m.context_len == 512 and m.attention_backend == "cpu"
    assert m.hicache == {"host_used_tokens": 5, "storage_files": 2}
    assert merge_internal_states([a]) is a
