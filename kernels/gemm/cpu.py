"""Linear layers over panel-packed weights with radixlm's C++ microkernel (``cpu/gemm.cpp``).

``prepare`` reorders an (out, in) fp32 or bf16 weight once into panels of 16 output rows, k-major
(``(out / 16, in, 16)``; 8, 4, 2 or 1 rows when out is not a multiple of 16, the last two scalar);
``linear`` runs a 6 x 16 register-blocked AVX2 FMA microkernel over them
(BLIS's scheme: Van Zee & van de Geijn 2015). Each output element is one FMA chain over the input
features in order, so a row's result is bitwise the same whatever batch it is computed in (the
batch invariance SGLang's ``--enable-deterministic-inference`` asks of its kernels). Measured on a
2-core AMD EPYC (AVX2), SmolLM2-135M's linear shapes, one thread: 1.35-1.5x oneDNN's prepacked GEMM
at 32-64 rows, 1.4x at 1 row, the same at 512 rows (docs/benchmarks.md).

bf16 weights and activations are widened to fp32 exactly, accumulated in fp32 and the result rounded
once: on an AVX2 CPU about as fast as fp32 from half the bytes. With AVX512-BF16 the weight is packed in
pairs of k and multiplied with vdpbf16ps (``cpu/bf16_packed_avx512.h``): on a Zen 4 EPYC 1.7x oneDNN at
1 row, 1.1-1.4x at 8-64, the same at 128, ~0.9x at 1024 and more (docs/benchmarks.md), so ``auto``
uses it for bf16 there. With AMX-BF16 the same pair panels are AMX B tiles and run on TDPBF16PS
(``cpu/bf16_amx.h``; K a multiple of 32): on a 2-core AMX Xeon ~1.5x oneDNN's prepacked GEMM (which
runs AMX too) at 1-32 rows, 1.1-1.2x at 64-128, 0.8-1.0x at 512 — and batch-invariant, where
oneDNN's kernel choice changes with M. Weights of other dtypes stay dense and run through ``F.linear``.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from radixlm.kernels.cpu_extension import load_cpu_kernels
from radixlm.kernels.gemm.base import FUSED_DENSE, FUSED_PACKED, GemmBackend

def packable(weight: torch.Tensor) -> bool:
    """Whether ``prepare`` packs ``weight`` (else it stays dense): 2-D fp32 or bf16 on CPU."""
    return weight.dim() == 2 and weight.dtype in (torch.float32, torch.bfloat16) and weight.device.type == "cpu"


class CpuGemm(GemmBackend):
    """Raises CpuKernelsUnavailable when the C++ kernels cannot be built here."""

    name = "cpu"

    def __init__(self) -> None:
        load_cpu_kernels()
        self._pack, self._linear = torch.ops.radixlm_cpu.pack_linear_weight, torch.ops.radixlm_cpu.linear_packed

    def prepare(self, weight: torch.Tensor) -> torch.Tensor:
        """(out, in) fp32/bf16 -> (out / PW, in, PW) panels (same numel and dtype); other weights as they are."""
        return self._pack(weight) if packable(weight) else weight

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        if weight.dim() == 2:
            return F.linear(x, weight, bias)
        lead = x.shape[:-1]
        y = self._linear(x.reshape(-1, x.shape[-1]), weight, bias)
        return y.view(*lead, y.shape[-1])

    def swiglu_fusable(self, weight: torch.Tensor) -> bool:
        """bf16 gate-up weights on AVX512-BF16 without AMX, intermediate size a multiple of 48
        (``cpu/swiglu.cpp``): the SiLU-and-mul runs on each 48-column block while it is in L2."""
        return (packable(weight) and weight.dtype == torch.bfloat16 and weight.shape[0] % 2 == 0
                and bool(torch.ops.radixlm_cpu.gemm_swiglu_fused(weight.shape[1], weight.shape[0] // 2)))

    def prepare_gate_up(self, weight: torch.Tensor) -> torch.Tensor:
        return torch.ops.radixlm_cpu.pack_gate_up_weight(weight)

    def linear_silu_mul(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = torch.ops.radixlm_cpu.linear_packed_silu_mul(x.reshape(-1, x.shape[-1]), weight)
        return y.view(*lead, y.shape[-1])

    def fused_kind(self, weight: torch.Tensor, rows: int, dtype: torch.dtype) -> Optional[int]:
        if weight.dtype != dtype:
            return None
        return FUSED_DENSE if weight.dim() == 2 else FUSED_PACKED
