"""Linear layers over weights prepacked once into oneDNN's blocked layout (CPU).

``torch.nn.functional.linear`` on CPU reorders nothing ahead of time: each call hands MKL/oneDNN the
plain (out, in) weight, and the GEMM packs panels of it on the fly. Reordering the weight once
after loading (``torch.ops.mkldnn._reorder_linear_weight``, the same prepacking PyTorch's inductor
applies when it freezes a CPU model, and IPEX / vLLM-CPU apply to linear layers) and calling
``torch.ops.mkldnn._linear_pointwise`` skips that work. Measured on a 2-core AMD EPYC (AVX2, fp32,
2 threads), SmolLM2-135M shapes: 1.3-1.8x the GFLOP/s of ``F.linear`` at 32-64 rows and 2.5x for the
49152 x 576 LM head; about the same at 1 row (memory-bound). The packed tensor is an opaque
``torch._mkldnn`` tensor of the weight's logical shape; it replaces the dense one.

oneDNN packs fp32 on any x86-64 CPU; bf16 and fp16 need AVX512 (BW/VL/DQ) or AVX-NE-CONVERT, which
``onednn_supports`` asks oneDNN itself about.
"""

from __future__ import annotations

from typing import Optional

import torch

from radixlm.kernels.gemm.base import GemmBackend


def onednn_supports(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs and multiplies ``dtype`` weights on this CPU."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.float32:
        return True
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if dtype == torch.float16:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return False


class OneDnnGemm(GemmBackend):
    name = "onednn"

    def prepare(self, weight: torch.Tensor) -> torch.Tensor:
        if weight.is_mkldnn:
            return weight
        return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        lead = x.shape[:-1]
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]).contiguous(), weight, bias, "none", [], "")
        return y.view(*lead, y.shape[-1])
