"""The fused C++ elementwise ops (RMSNorm with the residual add, RoPE, SiLU-and-mul) against the
torch reference ops they replace: bitwise in fp32 for rope and silu_and_mul, to fp32 rounding for
the norm (only its sum of squares runs in another order), and step-by-step rounding in bf16/fp16."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.cpu_extension import cpu_kernels_error
from radixlm.kernels.elementwise import create_elementwise_backend
from radixlm.kernels.elementwise.torch_native import TorchNativeElementwise

pytestmark = pytest.mark.skipif(cpu_kernels_error() is not None, reason=str(cpu_kernels_error()))

REF = TorchNativeElementwise()


@pytest.fixture(scope="module")
def fused():
    return create_elementwise_backend("cpu", torch.device("cpu"))


def rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("hidden", [576, 64, 13])
@pytest.mark.parametrize("rows", [1, 7, 300])
def test_add_rms_norm_fp32(fused, rows, hidden):
    h, delta, w = rand(rows, hidden), rand(rows, hidden, seed=1), rand(hidden, seed=2)
    h_ref = h.clone()
    ref = REF.add_rms_norm(h_ref, delta, w, 1e-5)
    out = fused.add_rms_norm(h, delta, w, 1e-5)
    assert torch.equal(h, h_ref)  # the residual add in place, bitwise
    torch.testing.assert_close(out, ref, rtol=2e-6, atol=2e-6)
    plain = fused.add_rms_norm(h.clone(), None, w, 1e-5)  # no residual: a plain norm
    torch.testing.assert_close(plain, out, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_add_rms_norm_half_rounds_like_the_reference(fused, dtype):
    h, delta, w = rand(33, 576, dtype=dtype), rand(33, 576, dtype=dtype, seed=1), rand(576, dtype=dtype, seed=2)
    h_ref = h.clone()
    ref = REF.add_rms_norm(h_ref, delta, w, 1e-6)
    out = fused.add_rms_norm(h, delta, w, 1e-6)
    assert torch.equal(h, h_ref) and out.dtype == dtype
    # the fp32 statistics may differ in the last bit, which moves a few outputs by an ulp or two
    diff = (out.float() - ref.float()).abs()
    ulp = ref.float().abs() * (2 ** -7 if dtype == torch.bfloat16 else 2 ** -10)
    assert (diff <= 2 * ulp + 1e-6).all()  # one ulp of the intermediate, one of the product
    assert (out == ref).float().mean() > 0.95


def test_norm_of_a_non_contiguous_view(fused):
    """Qwen3's per-head q/k norm runs on a view into the fused qkv output."""
    qkv = rand(5, 3 * 64)
    q = qkv[:, :128].reshape(5, 2, 64)
    w = rand(64, seed=3)
    torch.testing.assert_close(fused.add_rms_norm(q, None, w, 1e-6), REF.add_rms_norm(q, None, w, 1e-6),
                               rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 16, 6])
def test_rope_equals_the_reference_bitwise(fused, dtype, head_dim):
    t, heads, kvh = 9, 6, 2
    qkv = rand(t, (heads + 2 * kvh) * head_dim, dtype=dtype)  # q and k as views into a fused projection
    q = qkv[:, :heads * head_dim].view(t, heads, head_dim)
    k = qkv[:, heads * head_dim:(heads + kvh) * head_dim].view(t, kvh, head_dim)
    cos, sin = rand(t, head_dim, dtype=dtype, seed=1), rand(t, head_dim, dtype=dtype, seed=2)
    qo, ko = fused.rope(q, k, cos, sin)
    qr, kr = REF.rope(q, k, cos, sin)
    assert qo.is_contiguous() and ko.is_contiguous()
    assert torch.equal(qo, qr) and torch.equal(ko, kr)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_bf16_rope_over_many_tokens_and_extreme_values_is_the_reference(fused, head_dim):
    """The AVX-512 bf16 path (a token's heads in one pass, bf16_rows_avx512.h) over more tokens than one
    thread's share, with infinities, NaN, subnormal products and overflowing ones: bitwise the torch
    reference wherever that is a number, NaN where it is NaN."""
    t, heads, kvh = 301, 9, 3
    qkv = rand(t, (heads + 2 * kvh) * head_dim, dtype=torch.bfloat16, seed=5) * 8
    flat = qkv.view(-1)
    flat[::97] = float("inf")
    flat[5::89] = float("-inf")
    flat[7::101] = float("nan")
    flat[11::53] = 1e-38  # times |cos| < 1: subnormal fp32 products, rounded as c10 rounds them
    flat[13::61] = 3e38  # times 2: past bf16's range
    q = qkv[:, :heads * head_dim].view(t, heads, head_dim)
    k = qkv[:, heads * head_dim:(heads + kvh) * head_dim].view(t, kvh, head_dim)
    cos = rand(t, head_dim, dtype=torch.bfloat16, seed=6) * 2
    sin = rand(t, head_dim, dtype=torch.bfloat16, seed=7) * 2
    for got, want in zip(fused.rope(q, k, cos, sin), REF.rope(q, k, cos, sin)):
        assert torch.equal(got.isnan(), want.isnan())
        num = ~want.isnan()
        assert torch.equal(got[num], want[num])
        assert torch.equal(got[num].view(torch.int16), want[num].view(torch.int16))  # signed zeros too
    assert want.isnan().any() and want.isinf().any()


def test_bf16_add_rms_norm_over_many_rows_rounds_as_the_reference(fused):
    """The AVX-512 bf16 row (bf16_rows_avx512.h) on more rows than one thread's share: the residual add
    bitwise, the output within the fp32-statistics ulp of the reference, and a NaN row stays NaN
    without touching the others."""
    h, delta = (rand(300, 576, dtype=torch.bfloat16, seed=s) for s in (8, 9))
    w = rand(576, dtype=torch.bfloat16, seed=10)
    h[7, 3] = float("nan")
    h_ref = h.clone()
    ref = REF.add_rms_norm(h_ref, delta, w, 1e-6)
    out = fused.add_rms_norm(h, delta, w, 1e-6)
    assert torch.equal(h.isnan(), h_ref.isnan()) and torch.equal(h.nan_to_num(), h_ref.nan_to_num())
    assert out[7].isnan().all() and not out[torch.arange(300) != 7].isnan().any()
    ok = torch.arange(300) != 7
    diff = (out[ok].float() - ref[ok].float()).abs()
    assert (diff <= 2 * ref[ok].float().abs() * 2 ** -7 + 1e-6).all()
    assert (out[ok] == ref[ok]).float().mean() > 0.95


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inter", [1536, 20, 3])
def test_silu_and_mul_equals_the_reference(fused, dtype, inter):
    x = rand(17, 2 * inter, dtype=dtype) * 4
    out, ref = fused.silu_and_mul(x), REF.silu_and_mul(x)
    if dtype == torch.float32:
        assert torch.equal(out, ref)
    else:  # the reference rounds silu to bf16 before the product, as the kernel does
        assert (out.float() - ref.float()).abs().max() <= ref.float().abs().max() * 2 ** -7


def test_bf16_silu_and_mul_rounds_as_the_reference(fused):
    """The bf16 kernel's exp2-based SiLU (exp2_avx512.h on AVX-512) is a few fp32 ulps from torch's expf
    before its bf16 rounding: at most 1 in 1,000 outputs may round the other way, by one bf16 step,
    and the edges (saturation, +-inf, NaN, signed zeros) are the reference's exactly."""
    torch.manual_seed(0)
    x = (torch.randn(256, 2 * 1536) * 4).bfloat16()
    out, ref = fused.silu_and_mul(x).float(), REF.silu_and_mul(x).float()
    diff = out != ref
    assert diff.float().mean() <= 1e-3
    assert ((out - ref).abs()[diff] <= ref.abs()[diff] * 2 ** -7).all()
    edges = [-200.0, -100.0, -88.0, -87.0, -50.0, -1e-30, 0.0, -0.0, 1e-30, 50.0, 88.0, 200.0, float("inf"),
             float("-inf"), float("nan"), 3.0]
    e = torch.tensor([edges + [1.0] * len(edges)]).bfloat16()
    got, want = fused.silu_and_mul(e), REF.silu_and_mul(e)
    assert torch.equal(got.isnan(), want.isnan())
    keep = ~want.isnan()
    assert torch.equal(got[keep], want[keep]) and torch.equal(got[keep].signbit(), want[keep].signbit())


def test_bad_shapes_raise(fused):
    with pytest.raises(RuntimeError, match="weight"):
        fused.add_rms_norm(rand(3, 8), None, rand(7), 1e-6)
    with pytest.raises(RuntimeError, match="cos, sin"):
        fused.rope(rand(3, 2, 8), rand(3, 1, 8), rand(2, 8), rand(2, 8))
    with pytest.raises(RuntimeError, match="2 \\* I"):
        fused.silu_and_mul(rand(3, 7))
    with pytest.raises(ValueError, match="unknown elementwise backend"):
        create_elementwise_backend("fast", torch.device("cpu"))
