"""FlashInfer vs torch_native attention on random paged batches laid out by the real KVManager +
RadixCache (page sizes 1 and 16; MHA, GQA 3 and 4; extend with and without cached prefixes, both
extend strategies; two decode steps). FlashInfer runs in bf16, the oracle in fp32 on the same
(bf16-rounded) values; outputs agree within bf16 tolerance and K/V land at ``out_cache_loc``."""

from __future__ import annotations


import pytest
import torch

from radixlm.kernels.attention.torch_native import TorchNativeAttnBackend
from radixlm.srt.forward_batch import ForwardBatch
from tests.kernels.paged_batches import (cache_prompt, finish_step, make_setup, mixed_prompts, schedule_decode,
                                         schedule_extend)

pytestmark = pytest.mark.gpu
D = 64
TOL = dict(atol=2e-2, rtol=2e-2)


@pytest.fixture(scope="module")
def backend_cls():
    pytest.importorskip("flashinfer")
    from radixlm.kernels.attention.flashinfer_backend import FlashInferAttnBackend

    return FlashInferAttnBackend


def _setup(page_size: int, kvh: int):
    setup = make_setup(page_size, num_pages=4096 // page_size, context=1024, kv_heads=kvh, head_dim=D,
                       dtype=torch.bfloat16, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(1)
    for buf in setup.kv_pool.k_buffers + setup.kv_pool.v_buffers:  # "cached" K/V everywhere
        buf.copy_(torch.randn(buf.shape, generator=g, device="cuda"))
    return setup


def _check(setup, batch, backend, h: int, kvh: int, seed: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = len(batch.input_ids)
    q, k, v = (torch.randn(t, n * D, generator=g, device="cuda").bfloat16() for n in (h, kvh, kvh))
    oracle_pool = setup.kv_pool.relayout("HND", torch.float32)
    dev = torch.device("cuda")
    fb = ForwardBatch.init_new(batch, setup.req_to_token_pool, setup.kv_pool, backend, dev)
    out = backend.forward(q, k, v, 0, fb)
    native = TorchNativeAttnBackend(h, kvh, D, D ** -0.5)
    ref_fb = ForwardBatch.init_new(batch, setup.req_to_token_pool, oracle_pool, native, dev)
    ref = native.forward(q.float(), k.float(), v.float(), 0, ref_fb)
    torch.testing.assert_close(out.float(), ref, **TOL)
    loc = torch.tensor(batch.out_cache_loc, device="cuda")
    assert torch.equal(setup.kv_pool.k_buffers[0][loc], k.view(t, kvh, D))
    assert torch.equal(setup.kv_pool.v_buffers[0][loc], v.view(t, kvh, D))


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2), (9, 3)], ids=["mha", "gqa4", "gqa3"])
@pytest.mark.parametrize("use_ragged", [True, False], ids=["ragged", "paged"])
def test_extend_with_prefix_then_decode(backend_cls, page_size, heads, use_ragged):
    h, kvh = heads
    setup = _setup(page_size, kvh)
    earlier, prompts = mixed_prompts(page_size)
    cache_prompt(setup, earlier)
    backend = backend_cls(h, kvh, D, D ** -0.5, use_ragged=use_ragged)
    reqs, batch = schedule_extend(setup, prompts)
    assert any(batch.prefix_lens) and not all(batch.prefix_lens)
    _check(setup, batch, backend, h, kvh, seed=2)
    for step in range(2):
        finish_step(reqs)
        _check(setup, schedule_decode(setup, reqs), backend, h, kvh, seed=3 + step)


@pytest.mark.parametrize("page_size", [1, 16])
def test_extend_without_prefix_and_long_rows(backend_cls, page_size):
    setup = _setup(page_size, 2)
    backend = backend_cls(8, 2, D, D ** -0.5)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (1, 5, 300, 17, 640)]
    reqs, batch = schedule_extend(setup, prompts)
    assert not any(batch.prefix_lens)
    _check(setup, batch, backend, 8, 2, seed=5)
    finish_step(reqs)
    _check(setup, schedule_decode(setup, reqs), backend, 8, 2, seed=6)
