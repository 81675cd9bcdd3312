"""Quantized linears (kernels/quant): the C++ kernels against the dequantize-to-float reference.

- dequantization: the C++ op, the torch reference and gguf-py's numpy code agree bitwise;
- the decode kernel (8-bit activations, integer block dot products) equals
  dequantize(W) @ dequantize(quantize8(x)) to fp32 rounding, and dequantize(W) @ x to within the
  8-bit activation rounding, for each format, M = 1..64, odd N;
- QuantGemm (the backend the model uses) over both of its paths, bias, leading dims;
- bad shapes are clear errors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from radixlm.kernels.cpu_extension import cpu_kernels_error, load_cpu_kernels
from radixlm.kernels.quant import gemm as quant_gemm
from radixlm.kernels.quant.formats import (FORMATS, dequantize_reference, get_format, quantize_activations_reference,
                                           quantize_int8)
from radixlm.kernels.quant.gemm import QuantGemm

pytestmark = pytest.mark.skipif(cpu_kernels_error() is not None, reason=f"no C++ CPU kernels: {cpu_kernels_error()}")
gguf = pytest.importorskip("gguf")
GGUF_TYPES = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
              "q4_1": gguf.GGMLQuantizationType.Q4_1}


def _weight(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 0.05 + torch.rand(n, 1, generator=g) * 0.02  # rows with an offset


def _pack(fmt: str, w: torch.Tensor) -> torch.Tensor:
    if fmt == "int8":
        return quantize_int8(w)
    return torch.from_numpy(np.ascontiguousarray(gguf.quants.quantize(w.numpy(), GGUF_TYPES[fmt])))


def _ops():
    load_cpu_kernels()
    return torch.ops.radixlm_cpu


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("k", [32, 96, 576])
def test_dequantize_matches_the_reference_bitwise(fmt, k):
    w = _weight(37, k, k)
    packed = _pack(fmt, w)
    assert packed.dtype == torch.uint8 and packed.shape == (37, get_format(fmt).row_bytes(k))
    ours = _ops().quant_dequantize(packed, get_format(fmt).code, k)
    ref = dequantize_reference(packed, fmt, k)
    assert torch.equal(ours, ref)
    if fmt != "int8":
        numpy_ref = torch.from_numpy(gguf.quants.dequantize(packed.numpy(), GGUF_TYPES[fmt]))
        assert torch.equal(ours, numpy_ref)
    # quantization error bound of the format: half a step (4-bit: (max - min) / 15 or max / 8 per block)
    step = {"int8": w.abs().amax() / 127, "q8_0": w.abs().amax() / 127, "q4_0": w.abs().amax() / 8 * 2,
            "q4_1": (w.amax() - w.amin()) / 15}[fmt]
    assert (ours - w).abs().max() <= step * 0.51 + 1e-3 * w.abs().amax()


def test_int8_is_per_channel_symmetric():
    w = _weight(5, 64, 0)
    w[2] = 0  # an all-zero row: scale 0, weights 0
    packed = quantize_int8(w)
    scale = packed[:, :4].contiguous().view(torch.float32).flatten()
    torch.testing.assert_close(scale, w.abs().amax(dim=1) / 127, rtol=0, atol=0)
    q = packed[:, 4:].view(torch.int8)
    assert q.abs().max() == 127 and torch.equal(q[2], torch.zeros(64, dtype=torch.int8))
    assert torch.equal(dequantize_reference(packed, "int8", 64)[2], torch.zeros(64))


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 13, 16, 33, 64])
def test_decode_kernel_equals_dequantized_matmul(fmt, m):
    n, k = 75, 576  # N odd: no alignment assumed across rows
    w = _weight(n, k, m)
    packed = _pack(fmt, w)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(100 + m))
    x[0, :32] = 0  # an all-zero activation block (d = 0)
    code = get_format(fmt).code
    wd = dequantize_reference(packed, fmt, k)
    full = F.linear(x, wd)
    # 8-bit activations: exact for the rounded activations ...
    y = _ops().quant_linear(x, packed, code, k, True)
    assert y.shape == (m, n) and y.dtype == torch.float32
    torch.testing.assert_close(y, F.linear(quantize_activations_reference(x), wd), rtol=1e-5, atol=1e-4)
    # ... and against the fp32 activations only the 8-bit activation rounding (relative to the output scale)
    assert (y - full).abs().max() <= 0.02 * full.abs().max()
    assert (y - full).norm() <= 0.01 * full.norm()
    assert (y - full).abs().max() > 1e-4  # it is there: the two kernels differ
    # fp32 activations: dequantize(W) @ x up to fp32 rounding
    yf = _ops().quant_linear(x, packed, code, k, False)
    torch.testing.assert_close(yf, full, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("k", [32, 96, 512, 736, 1536])  # 1, 3, 16, 23, 48 blocks a row: scale runs of 16 and tails
@pytest.mark.parametrize("m", [1, 3])
def test_decode_kernel_fp32_activations_over_block_counts(fmt, k, m):
    w = _weight(21, k, k + m)
    packed = _pack(fmt, w)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k))
    y = _ops().quant_linear(x, packed, get_format(fmt).code, k, False)
    torch.testing.assert_close(y, F.linear(x, dequantize_reference(packed, fmt, k)), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1"])
@pytest.mark.parametrize("k", [32, 96, 576, 736, 1536])  # 1, 3, 18, 23, 48 blocks: odd pair tails, scale windows
def test_decode_kernel_bf16_activations_equals_dequantized_matmul_rounded(fmt, k):
    """bf16 x over 4-bit blocks (vdpbf16ps on nibbles as bf16 128 + q where the CPU has AVX512-BF16,
    else fp32 on the widened x): y is dequantize(W) @ x rounded to bf16 — within one bf16 step of the
    exact product everywhere, equal to its rounding almost everywhere — and a row's result does not
    depend on the other rows of the call (M = 1..8)."""
    n = 43  # 10 groups of 4 rows and a tail of 3
    w = _weight(n, k, k)
    packed = _pack(fmt, w)
    x = torch.randn(8, k, generator=torch.Generator().manual_seed(k)).bfloat16()
    x[1, :32] = 0  # an all-zero activation block
    x[2, -32:] *= 50  # an outlier block
    ref = x.double() @ dequantize_reference(packed, fmt, k).double().T
    code = get_format(fmt).code
    y = _ops().quant_linear(x, packed, code, k, False)
    assert y.dtype == torch.bfloat16 and y.shape == (8, n)
    err = (y.double() - ref).abs()
    assert (err <= ref.abs() * 2.0 ** -8 + 1e-6 * ref.abs().max()).all()
    assert (y == ref.float().bfloat16()).double().mean() >= 0.97
    for m in range(1, 8):
        assert torch.equal(_ops().quant_linear(x[:m], packed, code, k, False), y[:m])
    assert torch.equal(_ops().quant_linear(x[5:6], packed, code, k, False), y[5:6])
    # prefill-sized calls (passes of 8 rows over the weight): every row as when computed alone
    for reps in (3, 5):  # 29 rows (one pass over the weight), 45 rows (8 rows at a time)
        xm = torch.cat([x] * reps + [x[:5]])
        ym = _ops().quant_linear(xm, packed, code, k, False)
        assert torch.equal(ym, torch.cat([y] * reps + [y[:5]]))


@pytest.mark.parametrize("fmt", ["int8", "q8_0"])
def test_decode_kernel_bf16_activations_other_formats_widen_to_fp32(fmt):
    k = 96
    packed = _pack(fmt, _weight(19, k, 3))
    x = torch.randn(3, k).bfloat16()
    code = get_format(fmt).code
    y = _ops().quant_linear(x, packed, code, k, False)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, _ops().quant_linear(x.float(), packed, code, k, False).bfloat16())


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("int8_activations", [True, False])
def test_quant_gemm_backend_both_paths(fmt, int8_activations):
    k, n = 96, 40
    w = _weight(n, k, 7)
    backend = QuantGemm(fmt, k, None if fmt == "int8" else _pack(fmt, w), int8_activations)
    rounded = quantize_activations_reference if int8_activations else (lambda t: t)
    packed = backend.prepare(w)
    assert packed.dtype == torch.uint8 and packed.numel() == n * get_format(fmt).row_bytes(k)
    assert backend.prepare(packed) is packed  # preparing twice is a no-op
    wd = backend.dequantize(packed)
    bias = torch.randn(n)
    for m in (1, quant_gemm.SMALL_M // 2, quant_gemm.SMALL_M // 2 + 1, quant_gemm.SMALL_M):
        x = torch.randn(2, m, k)  # leading dims kept
        y = backend.linear(x, packed, bias)
        assert y.shape == (2, m, n)
        if 2 * m <= quant_gemm.SMALL_M:
            ref = F.linear(rounded(x.reshape(-1, k)), wd, bias).view(2, m, n)
        else:  # batched: the panel kernel = the fp32 packed GEMM on the dequantized weight, bitwise
            ops = _ops()
            ref = ops.linear_packed(x.reshape(-1, k), ops.pack_linear_weight(wd), bias).view(2, m, n)
            assert torch.equal(y, ref)
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-4)
    xb = torch.randn(3, k).bfloat16()
    yb = backend.linear(xb, packed)
    assert yb.dtype == torch.bfloat16
    torch.testing.assert_close(yb.float(), F.linear(rounded(xb.float()), wd), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("n", [48, 40, 36, 18, 7])  # panel widths 16, 8, 4, 2, 1
def test_panel_kernel_is_the_packed_fp32_gemm_of_the_dequantized_weight(fmt, n):
    ops = _ops()
    k = 576 if n == 48 else 96
    w = _weight(n, k, 11)
    packed = _pack(fmt, w)
    wd = ops.quant_dequantize(packed, get_format(fmt).code, k)
    dense = ops.pack_linear_weight(wd)
    bias = torch.randn(n)
    for m in (1, 5, 9, 32, 97, 200):  # tiles of every height, more than one row block
        x = torch.randn(m, k)
        y = ops.quant_linear_panels(x, packed, get_format(fmt).code, k, bias)
        assert torch.equal(y, ops.linear_packed(x, dense, bias)), (m, n)
        assert torch.equal(ops.quant_linear_panels(x[3:4], packed, get_format(fmt).code, k, bias), y[3:4])  # row alone
        torch.testing.assert_close(y, F.linear(x, wd, bias), rtol=1e-5, atol=1e-4)


def test_bad_shapes_are_clear_errors():
    with pytest.raises(ValueError, match="multiple of the quantization block size 32"):
        QuantGemm("q4_1", 100)
    with pytest.raises(ValueError, match="multiple of the quantization block size 32"):
        quantize_int8(torch.randn(4, 48))
    with pytest.raises(ValueError, match="unknown quantized format"):
        QuantGemm("q5_k", 64)
    with pytest.raises(ValueError, match="rows of 40 bytes"):
        QuantGemm("q4_1", 64, torch.zeros(3, 36, dtype=torch.uint8))
    with pytest.raises(ValueError, match="only int8 quantizes at load"):
        QuantGemm("q4_0", 64).prepare(torch.randn(3, 64))
    ops = _ops()
    packed = _pack("q4_1", _weight(4, 64, 1))
    with pytest.raises(RuntimeError, match="needs 40"):
        ops.quant_linear(torch.randn(1, 64), packed[:, :30].contiguous(), get_format("q4_1").code, 64, True)
    with pytest.raises(RuntimeError, match="float32 \\(M, 64\\)"):
        ops.quant_linear_panels(torch.randn(2, 32), packed, get_format("q4_1").code, 64, None)
    with pytest.raises(RuntimeError, match="bias must be"):
        ops.quant_linear_panels(torch.randn(2, 64), packed, get_format("q4_1").code, 64, torch.randn(5))
    with pytest.raises(RuntimeError, match="x must be a CPU float32"):
        ops.quant_linear(torch.randn(1, 32), packed, get_format("q4_1").code, 64, True)
    with pytest.raises(RuntimeError, match="unknown quantized format"):
        ops.quant_dequantize(packed, 9, 64)


@pytest.mark.slow
@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_other_builds_compute_the_same(tmp_path, capability):
    """The portable (non-AVX2) code and the AVX2 code (which an AVX-512 machine does not run by itself):
    built with ATEN_CPU_CAPABILITY=<capability> in a fresh cache (~1 min each)."""
    import os
    import subprocess
    import sys
    import textwrap

    from radixlm.srt.cpu_runtime import cpu_info

    if capability == "avx2" and not {"avx2", "fma", "f16c"} <= set(cpu_info().flags):
        pytest.skip("this CPU has no AVX2 + FMA + F16C")
    if capability == "avx2" and torch.backends.cpu.get_cpu_capability() == "AVX2":
        pytest.skip("the AVX2 build is this machine's own: the tests above ran it")

    script = textwrap.dedent("""
        import sys
        import numpy as np, torch, torch.nn.functional as F, gguf
        from radixlm.kernels.cpu_extension import _capability, load_cpu_kernels
        from radixlm.kernels.quant.formats import (FORMATS, dequantize_reference, quantize_activations_reference,
                                                   quantize_int8)
        assert _capability() == sys.argv[1].upper(), _capability()
        load_cpu_kernels()
        ops = torch.ops.radixlm_cpu
        types = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
                 "q4_1": gguf.GGMLQuantizationType.Q4_1}
        w = torch.randn(39, 96) * 0.05 + torch.rand(39, 1) * 0.02  # 39 rows: odd, no alignment assumed
        for name, f in FORMATS.items():
            packed = quantize_int8(w) if name == "int8" else torch.from_numpy(
                np.ascontiguousarray(gguf.quants.quantize(w.numpy(), types[name])))
            wd = dequantize_reference(packed, name, 96)
            assert torch.equal(ops.quant_dequantize(packed, f.code, 96), wd), name
            for m in (1, 2, 3, 5, 9):
                x = torch.randn(m, 96)
                y = ops.quant_linear(x, packed, f.code, 96, True)
                torch.testing.assert_close(y, F.linear(quantize_activations_reference(x), wd), rtol=1e-5, atol=1e-4)
                yf = ops.quant_linear(x, packed, f.code, 96, False)
                torch.testing.assert_close(yf, F.linear(x, wd), rtol=1e-5, atol=1e-4)
        print("BUILD OK")
    """)
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "RADIXLM_KERNEL_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", script, capability], env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "BUILD OK" in out.stdout
