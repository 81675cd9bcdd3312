"""GEMM backends (kernels/gemm): prepacked oneDNN linears equal F.linear on the dense weight."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlm.kernels.gemm import bf16_pairs_preferred, create_gemm_backend
from radixlm.kernels.gemm.onednn import OneDnnGemm, onednn_supports
from radixlm.kernels.gemm.torch_native import TorchNativeGemm

CPU = torch.device("cpu")
needs_onednn = pytest.mark.skipif(not onednn_supports(torch.float32), reason="oneDNN is not available")


@needs_onednn
@pytest.mark.parametrize("rows", [1, 3, 64, 301])
@pytest.mark.parametrize("bias", [False, True])
def test_onednn_linear_equals_f_linear_fp32(rows, bias):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 40, generator=g)
    b = torch.randn(96, generator=g) if bias else None
    x = torch.randn(rows, 40, generator=g)
    gemm = OneDnnGemm()
    packed = gemm.prepare(w.clone())
    assert packed.is_mkldnn and packed.shape == w.shape and packed.numel() == w.numel()
    y = gemm.linear(x, packed, b)
    ref = F.linear(x, w, b)
    assert y.shape == ref.shape and y.dtype == torch.float32
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    assert not torch.equal(y, torch.zeros_like(y))


@needs_onednn
def test_onednn_linear_keeps_leading_dims_and_non_contiguous_input():
    w = torch.randn(24, 16)
    gemm = OneDnnGemm()
    packed = gemm.prepare(w)
    x = torch.randn(16, 2, 5).permute(1, 2, 0)  # (2, 5, 16), not contiguous
    torch.testing.assert_close(gemm.linear(x, packed), F.linear(x, w), rtol=1e-5, atol=1e-5)
    assert gemm.prepare(packed) is packed  # preparing twice is a no-op


@pytest.mark.skipif(not onednn_supports(torch.bfloat16), reason="oneDNN has no bf16 GEMM on this CPU")
def test_onednn_linear_bf16():
    w = torch.randn(64, 32).bfloat16()
    x = torch.randn(7, 32).bfloat16()
    gemm = OneDnnGemm()
    y = gemm.linear(x, gemm.prepare(w))
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), F.linear(x.float(), w.float()), rtol=2e-2, atol=2e-2)


def test_bf16_pairs_with_avx512_bf16_builds():
    from radixlm.srt.cpu_runtime import CpuInfo

    zen4 = CpuInfo("AMD EPYC", ("avx2", "avx512f", "avx512_bf16"), 2)
    assert bf16_pairs_preferred(zen4, "AVX512")
    assert not bf16_pairs_preferred(zen4, "AVX2")  # an AVX2 build has no vdpbf16ps tiles
    spr = CpuInfo("Xeon", ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile"), 2)
    assert bf16_pairs_preferred(spr, "AVX512")  # AMX: the pair panels on TDPBF16PS tiles
    assert not bf16_pairs_preferred(CpuInfo("Xeon", ("avx2", "avx512f"), 2), "AVX512")  # no bf16 units


def test_create_gemm_backend_choices():
    from radixlm.kernels.cpu_extension import cpu_kernels_error

    auto = create_gemm_backend("auto", CPU, torch.float32)
    assert auto.name == ("cpu" if cpu_kernels_error() is None else
                         "onednn" if onednn_supports(torch.float32) else "torch_native")
    from radixlm.srt.cpu_runtime import cpu_info, prefers_bf16

    # bf16: the batch-invariant cpu kernel (AMX or vdpbf16ps tiles with AVX512-BF16, widened fp32
    # chains without bf16 units), except on an AVX2 build for a CPU with bf16 units
    bf16 = create_gemm_backend("auto", CPU, torch.bfloat16).name
    info = cpu_info()
    if prefers_bf16(info) and not bf16_pairs_preferred(info, torch.backends.cpu.get_cpu_capability()):
        assert bf16 == ("onednn" if onednn_supports(torch.bfloat16) else "torch_native")
    else:
        assert bf16 == ("cpu" if cpu_kernels_error() is None else
                        "onednn" if onednn_supports(torch.bfloat16) else "torch_native")
    assert isinstance(create_gemm_backend("torch_native", CPU, torch.float32), TorchNativeGemm)
    assert create_gemm_backend("auto", torch.device("cuda"), torch.float32).name == "torch_native"
    with pytest.raises(ValueError, match="unknown GEMM backend"):
        create_gemm_backend("cublas", CPU, torch.float32)
    with pytest.raises(ValueError, match="--device cpu"):
        create_gemm_backend("onednn", torch.device("cuda"), torch.float32)
    with pytest.raises(ValueError, match="--device cpu"):
        create_gemm_backend("cpu", torch.device("cuda"), torch.float32)
    if not onednn_supports(torch.float16):
        with pytest.raises(ValueError, match="torch_native"):
            create_gemm_backend("onednn", CPU, torch.float16)


@needs_onednn
def test_model_runner_prepacks_every_linear(stories_path):
    from radixlm.srt.engine import Engine
    from radixlm.srt.layers.linear import ColumnParallelLinear, ParallelLMHead, RowParallelLinear

    engine = Engine(stories_path, dtype="float32", max_total_tokens=512, gemm_backend="onednn")
    runner = engine.worker.model_runner
    assert runner.gemm_backend.name == "onednn"
    linears = [m for m in runner.model.modules()
               if isinstance(m, (ColumnParallelLinear, RowParallelLinear, ParallelLMHead))]
    assert len(linears) == 4 * runner.model_config.num_hidden_layers + 1
    assert all(m.weight.is_mkldnn and m.gemm is runner.gemm_backend for m in linears)
    assert not runner.model.embed_tokens.weight.is_mkldnn  # the embedding lookup keeps its dense table
    reference = Engine(stories_path, dtype="float32", max_total_tokens=512, gemm_backend="torch_native")
    assert not any(m.weight.is_mkldnn for m in reference.worker.model_runner.model.modules()
                   if isinstance(m, (ColumnParallelLinear, RowParallelLinear, ParallelLMHead)))


# ---- radixlm's packed-panel fp32 kernel (kernels/gemm/cpu) ----------------------------------------
def _cpu_gemm():
    from radixlm.kernels.cpu_extension import cpu_kernels_error

    if cpu_kernels_error() is not None:
        pytest.skip(f"C++ kernels unavailable: {cpu_kernels_error()}")
    from radixlm.kernels.gemm.cpu import CpuGemm

    return CpuGemm()


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 32, 97, 301])
@pytest.mark.parametrize("bias", [False, True])
def test_cpu_linear_matches_float64_reference(rows, bias):
    gemm = _cpu_gemm()
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 40, generator=g)
    b = torch.randn(96, generator=g) if bias else None
    x = torch.randn(rows, 40, generator=g)
    packed = gemm.prepare(w.clone())
    assert packed.shape == (6, 40, 16) and packed.numel() == w.numel() and packed.dtype == torch.float32
    y = gemm.linear(x, packed, b)
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    assert y.shape == (rows, 96) and y.dtype == torch.float32
    # One fp32 FMA chain per output: as close to the exact result as F.linear is.
    err, err_ref = (y.double() - ref).abs().max().item(), (F.linear(x, w, b).double() - ref).abs().max().item()
    assert err <= 4 * max(err_ref, 1e-6), (err, err_ref)


def test_cpu_linear_rows_do_not_depend_on_the_batch():
    """Bitwise: a row's output is the same alone, in any batch size and at any position."""
    gemm = _cpu_gemm()
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(160, 576, generator=g), torch.randn(160, generator=g)
    packed = gemm.prepare(w)
    x = torch.randn(131, 576, generator=g)
    full = gemm.linear(x, packed, b)
    for i in (0, 5, 6, 95, 96, 130):
        assert torch.equal(gemm.linear(x[i:i + 1], packed, b), full[i:i + 1]), i
    for lo, hi in ((3, 40), (90, 131), (0, 7)):
        assert torch.equal(gemm.linear(x[lo:hi], packed, b), full[lo:hi]), (lo, hi)


@pytest.mark.parametrize("out_features,width", [(344, 8), (20, 4), (6, 2), (7, 1)])
def test_cpu_linear_narrow_panels_for_other_output_sizes(out_features, width):
    """stories260K's gate_up has 344 outputs: 8-wide panels; narrower ones run scalar, same chains."""
    gemm = _cpu_gemm()
    g = torch.Generator().manual_seed(out_features)
    w, b = torch.randn(out_features, 24, generator=g), torch.randn(out_features, generator=g)
    packed = gemm.prepare(w)
    assert packed.shape == (out_features // width, 24, width)
    x = torch.randn(13, 24, generator=g)
    y = gemm.linear(x, packed, b)
    torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    assert all(torch.equal(gemm.linear(x[i:i + 1], packed, b), y[i:i + 1]) for i in range(13))


def test_cpu_linear_other_dtypes_stay_dense():
    gemm = _cpu_gemm()
    wh = torch.randn(32, 8).half()
    assert gemm.prepare(wh) is wh  # fp32 and bf16 only
    x = torch.randn(3, 8).half()
    torch.testing.assert_close(gemm.linear(x, wh), F.linear(x, wh))


def test_cpu_linear_leading_dims_non_contiguous_input_and_bad_arguments():
    gemm = _cpu_gemm()
    w = torch.randn(32, 16)
    packed = gemm.prepare(w)
    x = torch.randn(16, 2, 5).permute(1, 2, 0)  # (2, 5, 16), not contiguous
    torch.testing.assert_close(gemm.linear(x, packed), F.linear(x, w), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="features"):
        gemm.linear(torch.randn(3, 8), packed)
    with pytest.raises(RuntimeError, match="bias"):
        gemm.linear(torch.randn(3, 16), packed, torch.randn(31))
    with pytest.raises(RuntimeError, match="pack_linear_weight"):
        torch.ops.radixlm_cpu.linear_packed(torch.randn(3, 16), torch.randn(2, 16, 3), None)  # not a packed layout


def test_model_runner_packs_linears_with_the_cpu_backend(stories_path):
    from radixlm.srt.engine import Engine
    from radixlm.srt.layers.linear import ColumnParallelLinear, ParallelLMHead, RowParallelLinear

    _cpu_gemm()
    engine = Engine(stories_path, dtype="float32", max_total_tokens=512, gemm_backend="cpu")
    runner = engine.worker.model_runner
    linears = [m for m in runner.model.modules()
               if isinstance(m, (ColumnParallelLinear, RowParallelLinear, ParallelLMHead))]
    # Every linear is packed (stories260K's gate_up, 2 x 172 outputs, in 8-wide panels).
    assert len(linears) == 4 * runner.model_config.num_hidden_layers + 1 and all(m.weight.dim() == 3 for m in linears)
    assert all(m.gemm is runner.gemm_backend for m in linears)
    out = engine.generate("Once upon a time", {"temperature": 0, "max_new_tokens": 12})
    ref = Engine(stories_path, dtype="float32", max_total_tokens=512, gemm_backend="torch_native")
    assert out["output_ids"] == ref.generate("Once upon a time", {"temperature": 0, "max_new_tokens": 12})["output_ids"]


def test_cpu_linear_bf16_rounds_an_fp32_chain_once_and_is_batch_invariant():
    gemm = _cpu_gemm()
    g = torch.Generator().manual_seed(3)
    w = torch.randn(48, 200, generator=g).bfloat16()
    b = torch.randn(48, generator=g).bfloat16()
    x = torch.randn(29, 200, generator=g).bfloat16()
    packed = gemm.prepare(w)
    assert packed.shape == (3, 200, 16) and packed.dtype == torch.bfloat16
    y = gemm.linear(x, packed, b)
    assert y.dtype == torch.bfloat16
    exact = (F.linear(x.double(), w.double()) + b.double())
    # fp32 accumulation, one rounding to bf16: within one bf16 ulp of the exact result
    assert ((y.double() - exact).abs() <= exact.abs() * 2 ** -8 + 1e-3).all()
    for lo, hi in ((0, 1), (4, 11), (28, 29)):
        assert torch.equal(gemm.linear(x[lo:hi], packed, b), y[lo:hi])



def _cpu_has_bf16_dot() -> bool:
    from radixlm.srt.cpu_runtime import cpu_info

    return torch.backends.cpu.get_cpu_capability().startswith("AVX512") and "avx512_bf16" in cpu_info().flags


def test_cpu_linear_bf16_pair_panels_where_the_cpu_has_avx512_bf16():
    """With AVX512-BF16 a bf16 weight is packed in pairs of k (bf16_dot.h) and multiplied with
    vdpbf16ps; elsewhere it keeps the k-major panels. Either way: one fp32 chain per output rounded
    once, and bitwise the same rows whatever the batch, across the 12-row tiles' boundaries."""
    gemm = _cpu_gemm()
    g = torch.Generator().manual_seed(5)
    n, k = 64, 576
    w, b = torch.randn(n, k, generator=g).bfloat16(), torch.randn(n, generator=g).bfloat16()
    packed = gemm.prepare(w)
    plain = w.view(n // 16, 16, k).transpose(1, 2).contiguous()
    pairs = w.view(n // 16, 16, k // 2, 2).permute(0, 2, 1, 3).contiguous().view(n // 16, k, 16)
    assert torch.equal(packed, pairs if _cpu_has_bf16_dot() else plain)
    x = torch.randn(131, k, generator=g).bfloat16()
    full = gemm.linear(x, packed, b)
    exact = F.linear(x.double(), w.double()) + b.double()
    assert ((full.double() - exact).abs() <= exact.abs() * 2 ** -8 + 1e-2).all()
    for lo, hi in ((0, 1), (0, 11), (0, 12), (0, 13), (11, 36), (95, 131), (40, 41)):
        assert torch.equal(gemm.linear(x[lo:hi], packed, b), full[lo:hi]), (lo, hi)


@pytest.mark.parametrize("rows", [11, 12, 13, 24, 25])
def test_cpu_linear_fp32_tile_boundaries_are_batch_invariant(rows):
    """The 512-bit tiles (up to 12 rows) and the 256-bit ones (up to 6) run the same FMA chains."""
    gemm = _cpu_gemm()
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(48, 96, generator=g)
    packed = gemm.prepare(w)
    x = torch.randn(rows, 96, generator=g)
    y = gemm.linear(x, packed)
    assert all(torch.equal(gemm.linear(x[i:i + 1], packed), y[i:i + 1]) for i in range(rows))
    ref = F.linear(x.double(), w.double())
    assert (y.double() - ref).abs().max().item() <= 4 * max((F.linear(x, w).double() - ref).abs().max().item(), 1e-6)


@pytest.mark.parametrize("out_features", [160, 32, 48])  # 10 panels (tiles of 3, 3, 3, 1), 2, 3
def test_cpu_linear_fp32_packed_tiles_give_the_microkernel_bits(out_features):
    """fp32 linear_packed of 16-wide panels (at 512-bit width: 8-row x 3-panel tiles over packed
    activations, K in blocks of 128) runs the same FMA chains as the 8-wide panels' 256-bit tiles
    (each 8 output features packed alone): equal bits for every tile height, a K that is no multiple of
    the k block, bias and several row blocks; the quantized panel GEMM on the dequantized weight too;
    and a row alone equals it in the batch."""
    from radixlm.kernels.quant.formats import quantize_int8

    gemm = _cpu_gemm()
    ops = torch.ops.radixlm_cpu
    g = torch.Generator().manual_seed(out_features)
    k = 320  # 2 k blocks of 128 and one of 64
    q = quantize_int8(torch.randn(out_features, k, generator=g))
    wd = ops.quant_dequantize(q, 0, k)
    packed, bias = gemm.prepare(wd.clone()), torch.randn(out_features, generator=g)
    narrow = [(gemm.prepare(wd[j:j + 8].clone()), bias[j:j + 8]) for j in range(0, out_features, 8)]
    assert packed.shape[2] == 16 and all(p.shape[2] == 8 for p, _ in narrow)
    for m in (1, 3, 7, 8, 9, 17, 96, 97, 200, 600):  # K = 320: 512 rows a packed block
        x = torch.randn(m, k, generator=g)
        y = gemm.linear(x, packed, bias)
        assert torch.equal(y, torch.cat([gemm.linear(x, p, b) for p, b in narrow], dim=1)), m
        assert torch.equal(y, ops.quant_linear_panels(x, q, 0, k, bias)), m
        assert torch.equal(gemm.linear(x[m // 2:m // 2 + 1], packed, bias), y[m // 2:m // 2 + 1]), m
        ref = F.linear(x.double(), wd.double(), bias.double())  # within a k-term chain's rounding bound
        bound = (k + 1) * 2.0 ** -24 * (F.linear(x.double().abs(), wd.double().abs()) + bias.double().abs())
        assert bool(((y.double() - ref).abs() <= bound).all()), m


def test_cpu_linear_bf16_rounds_ties_to_even_and_keeps_nan():
    """The fp32 sums are exact here (few terms, short mantissas), so y must be torch's own rounding
    of them: ties go to the even bf16 (1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6), NaN stays NaN, on
    every path (a row alone, 8-row tiles, 3-panel groups and a 2-panel tail)."""
    gemm = _cpu_gemm()
    n, k = 80, 64  # 5 panels: a group of 3 and one of 2
    w = torch.zeros(n, k)
    w[:, 0] = 1.0
    w[:, 1] = torch.tensor([2.0 ** -8, 3 * 2.0 ** -8, -(2.0 ** -8), 2.0 ** -9, 1.0])[torch.arange(n) % 5]
    w[7, 5] = float("nan")
    x = torch.zeros(20, k)
    x[:, 0], x[:, 1] = 1.0, torch.arange(20) % 3 + 1.0
    b = (torch.arange(n) % 4 - 1.5) * 2.0 ** -8
    w, x, b = w.bfloat16(), x.bfloat16(), b.bfloat16()
    exact = (x.float() @ w.float().T + b.float()).bfloat16()  # every fp32 op here is exact
    assert exact.float().isnan().sum() == 20
    nan = exact.isnan()

    def same(y: torch.Tensor, ref: torch.Tensor, nan: torch.Tensor) -> bool:  # NaN payloads aside
        return torch.equal(y.isnan(), nan) and torch.equal(y[~nan].view(torch.int16), ref[~nan].view(torch.int16))

    packed = gemm.prepare(w)
    assert same(gemm.linear(x, packed, b), exact, nan)
    for i in (0, 9, 19):
        assert same(gemm.linear(x[i:i + 1], packed, b), exact[i:i + 1], nan[i:i + 1])


@pytest.mark.parametrize("n,k", [(80, 1000), (48, 34), (960, 576), (48, 2600)])  # 2600: two k blocks of 650 pairs
def test_cpu_linear_bf16_rows_alone_equal_rows_in_any_batch(n, k):
    """Few rows run one panel at a time front to back, more in 8-row x 3-panel tiles with K in
    blocks: the same chains, so a row's bits do not depend on which path or tile it fell in."""
    gemm = _cpu_gemm()
    g = torch.Generator().manual_seed(n + k)
    w, b = (torch.randn(n, k, generator=g) * 0.05).bfloat16(), torch.randn(n, generator=g).bfloat16()
    packed = gemm.prepare(w)
    x = torch.randn(200, k, generator=g).bfloat16()
    full = gemm.linear(x, packed, b)
    for lo, hi in ((0, 1), (3, 10), (5, 12), (8, 9), (17, 41), (100, 200), (199, 200)):
        assert torch.equal(gemm.linear(x[lo:hi], packed, b).view(torch.int16), full[lo:hi].view(torch.int16)), (lo, hi)
    exact = F.linear(x.double(), w.double()) + b.double()
    assert ((full.double() - exact).abs() <= exact.abs() * 2 ** -8 + 1e-2).all()


def _cpu_has_amx_bf16() -> bool:
    from radixlm.srt.cpu_runtime import cpu_info

    return _cpu_has_bf16_dot() and "amx_bf16" in cpu_info().flags


@pytest.mark.parametrize("n,k", [(16, 64), (48, 576), (80, 1536), (960, 576)])
def test_cpu_linear_bf16_amx_tiles_are_batch_invariant(n, k):
    """With AMX-BF16 (and K a multiple of 32) bf16 linears run on TDPBF16PS tiles (bf16_amx.h): up to
    16 rows one row tile over 4 panels, more rows in 32-row blocks of two row tiles x 2 panels, a
    last block of 17-31 or 1-16 rows, an odd panel alone. A row's bits must not depend on which of
    these it fell in, and the result is one fp32 chain rounded once (within a bf16 ulp)."""
    gemm = _cpu_gemm()
    assert torch.ops.radixlm_cpu.gemm_bf16_amx(k) == _cpu_has_amx_bf16()
    assert not torch.ops.radixlm_cpu.gemm_bf16_amx(k + 2)  # K % 32 != 0: the vdpbf16ps tiles
    g = torch.Generator().manual_seed(n * k)
    w, b = (torch.randn(n, k, generator=g) * 0.05).bfloat16(), torch.randn(n, generator=g).bfloat16()
    packed = gemm.prepare(w)
    x = torch.randn(70, k, generator=g).bfloat16()
    full = gemm.linear(x, packed, b)
    exact = F.linear(x.double(), w.double()) + b.double()
    assert ((full.double() - exact).abs() <= exact.abs() * 2 ** -8 + 1e-2).all()
    for lo, hi in ((0, 1), (0, 15), (0, 16), (0, 17), (3, 34), (0, 32), (0, 33), (0, 48), (5, 69), (69, 70)):
        assert torch.equal(gemm.linear(x[lo:hi], packed, b).view(torch.int16), full[lo:hi].view(torch.int16)), (lo, hi)


_AFTER_ONEDNN = """
import torch
from radixlm.kernels.gemm.cpu import CpuGemm
from radixlm.kernels.gemm.onednn import OneDnnGemm
gemm, onednn = CpuGemm(), OneDnnGemm()
g = torch.Generator().manual_seed(11)
w = (torch.randn(576, 576, generator=g) * 0.05).bfloat16()
x = torch.randn(128, 576, generator=g).bfloat16()
packed, dense = gemm.prepare(w), onednn.prepare(w)
for m in (1, 64, 128):
    before = gemm.linear(x[:m], packed)
    onednn.linear(x, dense)  # oneDNN's tiles (AMX brgemm at 128 rows) on the calling threads
    assert torch.equal(gemm.linear(x[:m], packed), before), m
print("ok")
"""


@pytest.mark.skipif(not onednn_supports(torch.bfloat16), reason="oneDNN has no bf16 GEMM on this CPU")
def test_cpu_bf16_kernels_after_onednn_loaded_its_own_tile_configuration():
    """oneDNN's bf16 GEMM loads its own AMX tile configuration (on AMX CPUs, from ~128 rows) on the
    same threads: radixlm's AMX linear (and attention) must read the configuration back and load
    theirs, not trust what they loaded last. A TDPBF16PS on another kernel's tile shapes faults
    (SIGILL: this ran so in a subprocess), and wrong shapes would give wrong sums."""
    import subprocess
    import sys

    _cpu_gemm()
    run = subprocess.run([sys.executable, "-c", _AFTER_ONEDNN], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", (run.returncode, run.stderr[-2000:])


def _swiglu_fused_here() -> bool:
    cpu = create_gemm_backend("cpu", torch.device("cpu"), torch.bfloat16)
    return cpu.swiglu_fusable(torch.zeros(96, 64, dtype=torch.bfloat16))


@pytest.mark.skipif(not _swiglu_fused_here(), reason="no fused gate-up here (AVX512-BF16 without AMX)")
@pytest.mark.parametrize("K,inter", [(64, 48), (576, 96), (576, 1536), (2304, 48)])  # 2304: two k blocks
@pytest.mark.parametrize("rows", [1, 7, 8, 33, 600])  # under 8: linear then SiLU; 600: two row blocks at K 576
def test_fused_gate_up_equals_linear_then_silu_and_mul(K, inter, rows):
    """The gate-up linear with its SiLU-and-mul fused (gemm/cpu/swiglu.cpp) gives the bits of the
    packed linear followed by silu_and_mul, and torch's bf16 ops within their rounding."""
    torch.manual_seed(rows)
    cpu = create_gemm_backend("cpu", torch.device("cpu"), torch.bfloat16)
    w = (torch.randn(2 * inter, K) * K ** -0.5).bfloat16()
    x = (torch.randn(rows, K) * 2).bfloat16()
    fused = cpu.linear_silu_mul(x, cpu.prepare_gate_up(w))
    unfused = torch.ops.radixlm_cpu.silu_and_mul(cpu.linear(x, cpu.prepare(w)))
    assert fused.shape == (rows, inter) and torch.equal(fused, unfused)
    gate, up = F.linear(x.float(), w.float()).bfloat16().chunk(2, dim=-1)
    ref = (F.silu(gate.float()).bfloat16().float() * up.float())
    assert (fused.float() - ref).abs().max() <= ref.abs().max() * 2 ** -6
    lead = cpu.linear_silu_mul(x.view(1, rows, K), cpu.prepare_gate_up(w))  # leading dims kept
    assert lead.shape == (1, rows, inter) and torch.equal(lead[0], fused)
