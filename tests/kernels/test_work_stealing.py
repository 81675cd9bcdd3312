"""The CPU kernels' work stealing (kernels/gemm/cpu/work_stealing.h): each thread starts on its own
share of a parallel loop and takes the units other threads have not reached yet. Whichever thread
computes a unit, and however many threads there are, every output must be written exactly once and
come out bitwise the same. More threads than this machine's cores (5 on CI's 2) keep some threads
descheduled while others finish their share and steal, so the stealing paths run here."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.cpu_extension import cpu_kernels_error
from tests.kernels.paged_batches import finish_step, schedule_decode
from tests.kernels.test_cpu_attention import _cascade_setup, qkv

pytestmark = pytest.mark.skipif(cpu_kernels_error() is not None, reason=str(cpu_kernels_error()))

THREADS = (1, 2, 3, 5)
REPEATS = 3  # each thread count a few times: other interleavings, other thieves


def same_bits_across_threads(fn) -> None:
    """fn() returns a tensor or a tuple of tensors; every thread count and repeat must give its bits."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        ref = fn()
        ref = ref if isinstance(ref, tuple) else (ref,)
        for n in THREADS:
            torch.set_num_threads(n)
            for r in range(REPEATS):
                out = fn()
                out = out if isinstance(out, tuple) else (out,)
                for a, b in zip(out, ref):
                    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (n, r)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype,k", [(torch.bfloat16, 576), (torch.bfloat16, 560), (torch.float32, 576)])
@pytest.mark.parametrize("rows", [1, 16, 45, 300])
def test_linear_rows_are_the_same_whoever_computes_them(dtype, k, rows):
    """bf16 K = 576: the AMX tiles where the CPU has them; K = 560 (not whole 32-k tiles): the
    vdpbf16ps pair panels (or the fp32-widening path without AVX512-BF16); fp32: the packed tiles."""
    from radixlm.kernels.gemm.cpu import CpuGemm

    gemm = CpuGemm()
    g = torch.Generator().manual_seed(rows)
    w = (torch.randn(960, k, generator=g) * 0.05).to(dtype)
    b = torch.randn(960, generator=g).to(dtype)
    packed = gemm.prepare(w)
    x = torch.randn(rows, k, generator=g).to(dtype)
    # a unit nobody computed would leave whatever memory the op's output was given: not the 1-thread bits
    same_bits_across_threads(lambda: gemm.linear(x, packed, b))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_attention_extend_decode_and_cascade_are_the_same_whoever_computes_them(dtype):
    from radixlm.kernels.attention.cpu_backend import CpuAttnBackend
    from radixlm.srt.forward_batch import ForwardBatch

    heads, kvh, d = 9, 3, 64
    setup, reqs, batch = _cascade_setup(1, dtype)
    backend = CpuAttnBackend(heads, kvh, d, d ** -0.5)
    for step in range(2):  # the extend (cascade over three groups, loners), then a decode step
        fb = ForwardBatch.init_new(batch, setup.req_to_token_pool, setup.kv_pool, backend, torch.device("cpu"))
        assert len(fb.attn_metadata[4]) == 3  # the cascade pass runs
        q, k, v = qkv(len(batch.input_ids), heads, kvh, d, seed=20 + step, dtype=dtype)
        # the op stores k, v at the batch's slots first: the same values every call, so calls repeat
        same_bits_across_threads(lambda: backend.forward(q, k, v, 0, fb))
        finish_step(reqs)
        batch = schedule_decode(setup, reqs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_elementwise_and_argmax_are_the_same_whoever_computes_them(dtype):
    from radixlm.kernels.argmax import _cpu_op
    from radixlm.kernels.elementwise import create_elementwise_backend

    ew = create_elementwise_backend("cpu", torch.device("cpu"))
    g = torch.Generator().manual_seed(3)
    h, delta, w = (torch.randn(*shape, generator=g).to(dtype) for shape in ((300, 576), (300, 576), (576,)))

    def norm():
        x = h.clone()  # the residual add is in place
        return ew.add_rms_norm(x, delta, w, 1e-5), x

    same_bits_across_threads(norm)
    gate_up = torch.randn(300, 2 * 1536, generator=g).to(dtype)
    same_bits_across_threads(lambda: ew.silu_and_mul(gate_up))
    qk = torch.randn(300, 12 * 64, generator=g).to(dtype)
    q, k = qk[:, :9 * 64].view(300, 9, 64), qk[:, 9 * 64:].view(300, 3, 64)
    cos, sin = torch.randn(300, 64, generator=g).to(dtype), torch.randn(300, 64, generator=g).to(dtype)
    same_bits_across_threads(lambda: ew.rope(q, k, cos, sin))
    argmax = _cpu_op()
    logits = torch.randn(130, 4099, generator=g)
    same_bits_across_threads(lambda: argmax(logits))
