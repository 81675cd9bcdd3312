"""The elementwise ops as fused C++ kernels (``cpu/elementwise.cpp``): one pass over memory and one
OpenMP region per op instead of the 3-8 torch ops (and temporaries) of the reference each.

Rounding follows the reference op by op; rope and silu_and_mul are bitwise equal to it in fp32 and
the norm differs only by the order of its fp32 sum of squares (tests/kernels/test_elementwise.py).
"""

from __future__ import annotations

from typing import Optional

import torch

from radixlm.kernels.cpu_extension import load_cpu_kernels
from radixlm.kernels.elementwise.base import ElementwiseBackend


class CpuElementwise(ElementwiseBackend):
    """Raises CpuKernelsUnavailable when the C++ kernels cannot be built here."""

    name = "cpu"

    def __init__(self):
        load_cpu_kernels()
        ops = torch.ops.radixlm_cpu
        self._norm, self._rope, self._silu = ops.add_rms_norm_, ops.rope, ops.silu_and_mul

    def add_rms_norm(self, h: torch.Tensor, delta: Optional[torch.Tensor], weight: torch.Tensor,
                     eps: float) -> torch.Tensor:
        shape = h.shape
        if delta is None:  # nothing written into h: a copy of a non-contiguous view is fine
            return self._norm(h.reshape(-1, shape[-1]), None, weight, eps).view(shape)
        h2 = h.view(-1, shape[-1])  # in place: h must be viewable as rows
        return self._norm(h2, delta.reshape(h2.shape), weight, eps).view(shape)

    def rope(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._rope(q, k, cos, sin)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        return self._silu(x)
