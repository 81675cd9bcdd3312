"""An exception inside a step's forward (an internal error: a kernel bug, an OOM, Ctrl-C) must not
leak KV nor poison the radix cache: the step's requests end with finish_reason abort (status 500)
before the exception propagates, the KV slots the failed step was given are freed, and what had been
computed before (a cached prefix, earlier chunks, earlier outputs) stays cached and correct.

stories260K in fp32, with a chunked prefill and page sizes 1 and 16; the failure is injected into the
model runner's forward at the n-th call (an extend chunk, then a decode step).
"""

from __future__ import annotations

import random

import pytest

from radixlm.managers.io_struct import TokenizedGenerateReq
from radixlm.srt.engine import Engine
from radixlm.srt.sampling_params import SamplingParams
from tests.engine.test_greedy_vs_hf import assert_clean


class InjectedFailure(RuntimeError):
    pass


@pytest.fixture(scope="module", params=[1, 16], ids=["page1", "page16"])
def engine(request, stories_path):
    return Engine(stories_path, dtype="float32", max_total_tokens=2048, page_size=request.param,
                  chunked_prefill_size=32, max_running_requests=8)


def _prompts() -> list[list[int]]:
    rng = random.Random(7)
    shared = [rng.randrange(3, 500) for _ in range(40)]
    return [shared + [rng.randrange(3, 500) for _ in range(n)] for n in (5, 30, 70)]


SP = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


def _fail_at(engine: Engine, monkeypatch, call: int) -> list[int]:
    """Make the runner's forward raise at its ``call``-th invocation (1-based) only; returns the counter."""
    runner = engine.worker.model_runner
    real = runner.forward
    calls = [0]

    def forward(batch, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            raise InjectedFailure(f"injected at forward {call}")
        return real(batch, **kwargs)

    monkeypatch.setattr(runner, "forward", forward)
    return calls


# forward 1: the first 32-token chunk of the first prompt (a chunked prefill); 4: a later extend
# batch; 8: a decode step with all three requests running
@pytest.mark.parametrize("call", [1, 4, 8])
def test_failed_forward_frees_its_kv_and_caches_nothing_wrong(engine, monkeypatch, call):
    prompts = _prompts()
    engine.flush_cache()
    want = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=SP)]
    engine.flush_cache()
    calls = _fail_at(engine, monkeypatch, call)
    with pytest.raises(InjectedFailure):
        engine.generate(input_ids=prompts, sampling_params=SP)
    assert calls[0] == call
    sched = engine.scheduler
    assert sched.is_idle()
    sched.kv.check_idle()  # every slot of the failed step is free or in the tree, nothing locked
    monkeypatch.undo()
    # the tree keeps only computed KV: the same prompts now (partly from the cache) give the same tokens
    got = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=SP)]
    assert got == want
    assert_clean(engine)


def test_failed_step_ends_each_request_once_with_500(engine, monkeypatch):
    engine.flush_cache()
    sched = engine.scheduler
    finishes: dict[str, list] = {}

    def record(out) -> None:
        for i, rid in enumerate(out.rids):
            if out.finished_reasons[i] is not None:
                finishes.setdefault(rid, []).append(out.finished_reasons[i])

    monkeypatch.setattr(sched, "send_output", record)
    for i, ids in enumerate(_prompts()):
        sched.add_request(TokenizedGenerateReq(rid=f"f{i}", input_ids=ids, sampling_params=SamplingParams.from_dict(SP)))
    _fail_at(engine, monkeypatch, 6)
    with pytest.raises(InjectedFailure):
        while sched.step():
            pass
    failed = {rid: f for rid, f in finishes.items() if f[0].status_code == 500}
    assert failed, finishes
    for rid, f in failed.items():
        assert len(f) == 1 and f[0].type == "abort" and "internal error" in f[0].message, (rid, f)
        assert "InjectedFailure" in f[0].message, f
    # the requests the failed step did not hold carry on (the forward works again), and every rid ends once
    while sched.step():
        pass
    assert set(finishes) == {"f0", "f1", "f2"}
    assert all(len(f) == 1 for f in finishes.values()), finishes
    monkeypatch.undo()
    assert_clean(engine)
