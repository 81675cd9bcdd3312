"""The reference GEMM backend: the dense weight as loaded, ``torch.nn.functional.linear``."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from radixlm.kernels.gemm.base import FUSED_DENSE, GemmBackend


class TorchNativeGemm(GemmBackend):
    name = "torch_native"

    def prepare(self, weight: torch.Tensor) -> torch.Tensor:
        return weight

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return F.linear(x, weight, bias)

    def fused_kind(self, weight: torch.Tensor, rows: int, dtype: torch.dtype) -> Optional[int]:
        return FUSED_DENSE if weight.dim() == 2 and weight.dtype == dtype else None
