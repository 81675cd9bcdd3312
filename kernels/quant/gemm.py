"""A GEMM backend over weights kept quantized (``--quantization int8`` / ``gguf``), C++ kernels on CPU.

One ``QuantGemm`` per linear layer (it knows the layer's format and in_features). ``prepare`` turns
the layer's weight into the packed uint8 rows of ``formats.py`` — quantizing the loaded float weight
(``int8``), or handing over blocks read from a GGUF file (``packed=``) — and ``linear`` multiplies:

- M (rows of x) up to ``SMALL_M``: ``torch.ops.radixlm_cpu.quant_linear``, which streams each weight
  block once for all M rows, unpacking it in registers (see ``cpu/quant_gemm.cpp``). This is decode,
  where reading the weights is the cost. By default the weights are unpacked to fp32 in registers and
  dotted with fp32 x (exact up to fp32 rounding); with AVX-512 the GGUF formats run 16 lanes wide,
  a 4-bit block as two lookups in a 16-entry table of its dequantized values (``quant_rows_avx512.h``).
  bf16 x (a bf16 model) over 4-bit blocks on a CPU with AVX512-BF16 runs ``quant_rows_bf16_avx512.h``:
  the nibbles become bf16 operands of ``vdpbf16ps`` in registers, y = dequantize(W) @ x up to fp32
  rounding, then rounded to bf16 (no conversion of x or y around the call). There the GGUF formats
  (Q8_0 on x widened to fp32 by the 256-bit rows) take this op for *every* M, not the panel kernel
  past ``SMALL_M``: each row's result is then the same alone or in any batch (bf16 greedy output must
  not depend on batching or caching), at some cost in prefill and large batches (docs/benchmarks.md). With ``int8_activations`` x is quantized to 8 bits
  per block of 32 and the block dot products are integer (llama.cpp's scheme): ~1.4x faster for a
  4-bit linear on one AVX2 core, but on the demo model's chat prompt the rounding of its outlier
  activations changed the answer ("The capital of France is Paris." became unrelated text), so
  the models run without it (docs/benchmarks.md).
- larger M (batched decode, prefill): ``torch.ops.radixlm_cpu.quant_linear_panels``: each thread
  unpacks 16 output features at a time into fp32 scratch in the packed GEMM's panel layout and runs
  the fp32 register-blocked microkernel (``kernels/gemm/cpu/microkernel.h``) over all M rows, so the
  compressed weight is read once and no dequantized copy is written; bitwise the fp32 packed GEMM
  (``kernels/gemm/cpu.py``) on the dequantized weight. Measured per call at SmolLM2-135M's shapes
  (one thread, CPU time): at M = 32, 0.56x quant_linear's time and 0.39x dequantize + ``F.linear``'s
  (docs/benchmarks.md, "Quantized weights, part 2").

The held weight is the packed tensor, so ``numel() * element_size()`` is its real size in bytes.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from radixlm.kernels.cpu_extension import load_cpu_kernels
from radixlm.kernels.gemm.base import GemmBackend
from radixlm.kernels.quant.formats import get_format, quantize_int8

def bf16_decode_preferred(info, capability: str) -> bool:
    """Whether GGUF 4-bit blocks decode faster with bf16 activations than fp32 ones here: an AVX-512
    build (``capability``: torch.backends.cpu.get_cpu_capability()) on a CPU (``info``: a CpuInfo)
    with AVX512-BF16, where ``quant_rows_bf16_avx512.h`` runs vdpbf16ps on the unpacked nibbles
    (Zen 4 / 5, Cooper Lake, Sapphire Rapids and later). ``--dtype auto`` then serves a GGUF in bf16."""
    return capability.startswith("AVX512") and "avx512_bf16" in info.flags


# Rows of x up to which the decode kernel runs; beyond it the panel kernel is faster
# (benchmarks/bench_quant_gemm.py; docs/benchmarks.md, "Quantized weights").
SMALL_M = 8


class QuantGemm(GemmBackend):
    """y = x W^T + b with W packed in ``fmt`` (``int8``, ``q8_0``, ``q4_0``, ``q4_1``).

    Args:
        fmt: the format name.
        in_features: K, a multiple of 32 (ValueError otherwise).
        packed: the packed (out, row_bytes) uint8 weight when it comes from a file; ``prepare`` then
            returns it instead of quantizing (only ``int8`` quantizes a float weight here).
        int8_activations: the decode kernel's activations in 8 bits (True) or fp32 (False, the default).

    Raises:
        CpuKernelsUnavailable: the C++ CPU kernels cannot be built here.
    """

    def __init__(self, fmt: str, in_features: int, packed: Optional[torch.Tensor] = None,
                 int8_activations: bool = False):
        self.format = get_format(fmt)
        self.in_features = in_features
        self.row_bytes = self.format.row_bytes(in_features)
        if packed is not None and (packed.dtype != torch.uint8 or packed.dim() != 2 or packed.shape[1] != self.row_bytes):
            raise ValueError(f"a {fmt} weight of in_features {in_features} has rows of {self.row_bytes} bytes, "
                             f"got {packed.dtype} {tuple(packed.shape)}")
        self._packed = packed
        self.int8_activations = int8_activations
        self.name = f"quant_{fmt}"
        load_cpu_kernels()
        self._linear = torch.ops.radixlm_cpu.quant_linear
        self._dequantize = torch.ops.radixlm_cpu.quant_dequantize
        self._panels = torch.ops.radixlm_cpu.quant_linear_panels
        # bf16 x over GGUF blocks on AVX512-BF16: the rows kernel for every M (batch-invariant rows)
        from radixlm.srt.cpu_runtime import cpu_info

        self._bf16_rows = (fmt in ("q4_0", "q4_1", "q8_0") and not int8_activations
                           and bf16_decode_preferred(cpu_info(), torch.backends.cpu.get_cpu_capability()))

    def prepare(self, weight: torch.Tensor) -> torch.Tensor:
        if weight.dtype == torch.uint8:
            return weight
        if self._packed is not None:
            if self._packed.shape[0] != weight.shape[0]:
                raise ValueError(f"packed weight has {self._packed.shape[0]} rows, the layer {weight.shape[0]}")
            packed, self._packed = self._packed.contiguous(), None
            return packed
        if self.format.name != "int8":
            raise ValueError(f"{self.format.name} weights come from a GGUF file; only int8 quantizes at load")
        if weight.shape[1] != self.in_features:
            raise ValueError(f"weight has in_features {weight.shape[1]}, expected {self.in_features}")
        return quantize_int8(weight)

    def dequantize(self, weight: torch.Tensor) -> torch.Tensor:
        """The fp32 (out, in) weight of a packed one."""
        return self._dequantize(weight, self.format.code, self.in_features)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        # decode's 2-D fp32 x skips the reshape / cast / view calls (~1-2 us each, 121 linears a step)
        x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        if self._rows_kernel(x2.shape[0], x2.dtype):
            # bf16 x goes in as it is (the AVX512-BF16 kernel for 4-bit blocks; else widened in C++)
            xs = x2 if x2.dtype in (torch.float32, torch.bfloat16) else x2.float()
            y = self._linear(xs, weight, self.format.code, self.in_features, self.int8_activations)
            if bias is not None:
                y = y.float() + bias.float()
        else:
            xf = x2 if x2.dtype == torch.float32 else x2.float()
            y = self._panels(xf, weight, self.format.code, self.in_features, None if bias is None else bias.float())
        if y.dtype != x.dtype:
            y = y.to(x.dtype)
        return y if x.dim() == 2 else y.view(*x.shape[:-1], y.shape[-1])

    def _rows_kernel(self, rows: int, dtype: torch.dtype) -> bool:
        """Whether ``linear`` runs the rows kernel (``quant_linear``) for ``rows`` rows of ``dtype`` x,
        else the panel kernel."""
        return rows <= SMALL_M or (dtype == torch.bfloat16 and self._bf16_rows)

    def fused_kind(self, weight: torch.Tensor, rows: int, dtype: torch.dtype) -> Optional[int]:
        # the rows kernel on x as it is, as ``linear`` picks it (the panel kernel takes fp32 copies)
        if self.int8_activations or dtype not in (torch.float32, torch.bfloat16):
            return None
        return self.format.code if self._rows_kernel(rows, dtype) else None
