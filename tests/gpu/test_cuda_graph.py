"""CUDA-graph decode equals eager decode (random-weight Llama, head_dim 64, bf16, FlashInfer).

Runner level: the same decode batches (sizes 1, 3, 5, 8 -> captured 1, 4, 8, 8) give the same logits
and K/V through ``CudaGraphRunner.replay`` as through ``ModelRunner.forward``, and padded rows
write nowhere but the dummy page. Engine level: greedy outputs with graphs on are the
transformers reference's (up to near-ties), as they are with graphs off."""

from __future__ import annotations

import pytest
import torch

from radixlm.radix_cache import RadixCache
from radixlm.managers.kv_manager import KVManager
from radixlm.srt.cuda_graph_runner import CudaGraphRunner
from radixlm.srt.engine import Engine
from tests.engine.reference import hf_greedy
from tests.gpu.helpers import assert_greedy_close, save_random_llama
from tests.kernels.paged_batches import PagedSetup, finish_step, schedule_decode, schedule_extend

pytestmark = pytest.mark.gpu
BF16_TOL = 0.25  # logit gap a bf16 forward may flip (see helpers.assert_greedy_close)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    pytest.importorskip("flashinfer")
    return save_random_llama(str(tmp_path_factory.mktemp("gqa4")), "gqa4")


def _engine(path: str, **kwargs) -> Engine:
    return Engine(path, device="cuda", attention_backend="flashinfer", max_total_tokens=16384,
                  max_running_requests=8, chunked_prefill_size=64, **kwargs)


def _prompts(n: int, seed: int = 7) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 512, (int(x),), generator=g).tolist()
            for x in torch.randint(1, 200, (n,), generator=g)]


@pytest.mark.parametrize("page_size", [1, 16])
def test_replay_equals_eager_decode(model_path, page_size):
    engine = _engine(model_path, disable_cuda_graph=True, page_size=page_size)
    mr = engine.worker.model_runner
    runner = CudaGraphRunner(mr, batch_sizes=[1, 2, 4, 8])
    tree = RadixCache(mr.page_pool, page_size)
    setup = PagedSetup(mr.page_pool, tree, KVManager(mr.page_pool, tree, mr.req_to_token_pool),
                       mr.req_to_token_pool, mr.kv_pool)
    reqs, batch = schedule_extend(setup, _prompts(8))
    mr.forward(batch)
    finish_step(reqs)
    k0 = mr.kv_pool.k_buffers[0]
    dummy = set(range(page_size))  # page 0: where padded rows write
    for size in (1, 3, 5, 8, 8):
        dec = schedule_decode(setup, reqs[:size])
        eager = mr.forward(dec)
        loc = torch.tensor(dec.out_cache_loc, device="cuda")
        k_eager, before = k0[loc].clone(), k0.clone()
        graph = runner.replay(dec).float()  # the model's dtype; ModelRunner.forward widens to fp32
        assert graph.shape == eager.shape
        torch.testing.assert_close(graph, eager, atol=0.1, rtol=0.02)
        top2 = eager.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 0.2
        assert torch.equal(graph.argmax(-1)[clear], eager.argmax(-1)[clear])
        torch.testing.assert_close(k0[loc], k_eager, atol=2e-2, rtol=2e-2)
        changed = set((k0 != before).flatten(1).any(1).nonzero().flatten().tolist())
        assert changed <= set(dec.out_cache_loc) | dummy
        finish_step(reqs[:size])


def test_engine_greedy_with_graphs_matches_reference(model_path):
    prompts = _prompts(8, seed=11)
    max_new = [16, 4, 12, 8, 16, 2, 10, 6]  # the batch shrinks 8 -> 1 across captured sizes
    sps = [{"temperature": 0, "max_new_tokens": m, "min_new_tokens": m} for m in max_new]
    ref = [r[:m] for r, m in zip(hf_greedy(model_path, tuple(map(tuple, prompts)), max(max_new)), max_new)]
    graphed_engine = _engine(model_path, disable_cuda_graph=False, page_size=4)
    if getattr(graphed_engine.worker.model_runner, "cuda_graph_runner", None) is None:
        pytest.skip("ModelRunner does not create a CudaGraphRunner yet (see srt/cuda_graph_runner.py)")
    graphed = [o["output_ids"] for o in graphed_engine.generate(input_ids=prompts, sampling_params=sps)]
    eager = [o["output_ids"] for o in _engine(model_path, disable_cuda_graph=True, page_size=4)
             .generate(input_ids=prompts, sampling_params=sps)]
    assert_greedy_close(model_path, prompts, eager, ref, BF16_TOL)
    assert_greedy_close(model_path, prompts, graphed, ref, BF16_TOL)
    graphed_engine.scheduler.kv.check_idle()
