"""Tensor parallelism on CPU (gloo, two processes): every rank runs the Scheduler on its weight shard,
rank 0 broadcasts the requests, and greedy outputs equal the single-process engine's."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch.multiprocessing as mp

from tests.conftest import STORY_PROMPTS

SP = {"temperature": 0, "max_new_tokens": 16, "min_new_tokens": 16}


def _rank_main(rank: int, size: int, init_file: str, model_path: str, prompts: list[list[int]], out_q,
               extra: dict = {}, passes: int = 1) -> None:  # noqa: B006 (never mutated)
    import torch

    from radixlm.managers.io_struct import TokenizedGenerateReq
    from radixlm.managers.scheduler import Scheduler
    from radixlm.managers.tp_worker import TpModelWorker
    from radixlm.srt.distributed import broadcast_messages, init_tp_group
    from radixlm.srt.model_config import ModelConfig
    from radixlm.srt.model_loader import load_tokenizer
    from radixlm.srt.sampling_params import SamplingParams
    from radixlm.srt.server_args import ServerArgs

    torch.set_num_threads(1)
    args = ServerArgs(model_path=model_path, dtype="float32", tp_size=size, max_total_tokens=2048, chunked_prefill_size=16,
                      page_size=4,
                      **extra)
    tp = init_tp_group(rank, size, f"file://{init_file}", torch.device("cpu"))
    mc = ModelConfig.from_path(model_path, dtype="float32")
    worker = TpModelWorker(mc, args, tp)
    outputs: dict[str, list[int]] = {}

    def collect(batch):
        for rid, ids in zip(batch.rids, batch.output_ids):
            outputs.setdefault(rid, []).extend(ids)

    sched = Scheduler(args, worker, load_tokenizer(mc.model_path), collect)
    for n in range(passes):  # later passes: after a flush, so prefixes come from the lower cache tiers
        msgs = None
        if rank == 0:
            msgs = [TokenizedGenerateReq(rid=f"p{n}r{i}", input_ids=ids, sampling_params=SamplingParams(**SP))
                    for i, ids in enumerate(prompts)]
        for m in broadcast_messages(tp, msgs):
            sched.handle_message(m)
        while sched.step():
            pass
        sched.kv.check_idle()
        sched.flush_cache()
    n_params = sum(p.numel() for p in worker.model_runner.model.parameters())
    out_q.put((rank, n_params, outputs, sched.internal_state().hicache))
    sched.close()
    torch.distributed.barrier()  # both ranks are past their last collective
    out_q.close()
    out_q.join_thread()  # the results are in the pipe before the exit below
    # End as the scheduler process does (managers/scheduler_process._exit_now): no process-group or
    # interpreter teardown. Tearing gloo down here aborted a rank now and then ("terminate called
    # without an active exception", exit -6) after its results were in.
    os._exit(0)


def run_tp2(stories_path, prompts, extra: dict = {}, passes: int = 1) -> dict:  # noqa: B006
    """Rank -> (parameter count, {rid: output ids}, hicache state) of a two-rank run."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init_file = os.path.join(tempfile.mkdtemp(), "tp_init")
    procs = [ctx.Process(target=_rank_main, args=(r, 2, init_file, stories_path, prompts, q, extra, passes))
             for r in range(2)]
    for p in procs:
        p.start()
    results = {}
    for _ in procs:
        rank, *rest = q.get(timeout=240)
        results[rank] = rest
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return results


def test_tp2_equals_tp1(stories_path):
    from radixlm.srt.engine import Engine

    engine = Engine(stories_path, dtype="float32", max_total_tokens=2048, chunked_prefill_size=16, page_size=4)
    prompts = [engine.tokenizer.encode(p) for p in STORY_PROMPTS[:8]]
    expected = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=SP)]
    full_params = sum(p.numel() for p in engine.worker.model_runner.model.parameters())
    results = run_tp2(stories_path, prompts)
    for rank in (0, 1):
        n_params, outputs, _ = results[rank]
        assert [outputs[f"p0r{i}"] for i in range(len(prompts))] == expected, f"rank {rank}"
        # Every weight is sharded except the norms: each rank holds about half.
        assert 0.45 * full_params < n_params < 0.55 * full_params


def test_tp2_hierarchical_cache_loads_the_same_pages_on_every_rank(stories_path, tmp_path):
    """Pass 2 runs after /flush_cache: prefixes come back from storage through each rank's background
    reader; the ranks agree on when a request may start and how many pages it loads."""
    from radixlm.srt.engine import Engine

    engine = Engine(stories_path, dtype="float32", max_total_tokens=2048, chunked_prefill_size=16, page_size=4)
    prompts = [engine.tokenizer.encode(p) for p in STORY_PROMPTS[:6]]
    expected = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=SP)]
    extra = {"enable_hierarchical_cache": True, "hicache_storage_backend": "file", "hicache_storage_dir": str(tmp_path)}
    results = run_tp2(stories_path, prompts, extra, passes=2)
    for rank in (0, 1):
        _, outputs, _ = results[rank]
        for n in (0, 1):
            assert [outputs[f"p{n}r{i}"] for i in range(len(prompts))] == expected, f"rank {rank} pass {n}"
    (_, _, h0), (_, _, h1) = results[0], results[1]
    assert h0["loaded_storage_tokens"] > 0 and h0["prefetch_tasks"] > 0
    for k in ("loaded_storage_tokens", "loaded_host_tokens", "cached_tokens_storage", "cached_tokens_host"):
        assert h0[k] == h1[k], k
