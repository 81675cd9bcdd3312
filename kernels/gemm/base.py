"""GEMM backend interface: how a linear layer's weight is stored and multiplied.

A backend turns a loaded dense weight (out_features, in_features) into the form its kernel reads
(``prepare``, once after loading, like vLLM's ``process_weights_after_loading``) and computes
y = x W^T + b with it (``linear``). Kernels per device sit side by side behind this interface; the
torch_native backend (``torch.nn.functional.linear`` on the dense weight) is the reference.
"""

from __future__ import annotations

import abc
from typing import Optional

import torch


class GemmBackend(abc.ABC):
    name = ""

    @abc.abstractmethod
    def prepare(self, weight: torch.Tensor) -> torch.Tensor:
        """The weight as this backend stores it, from a dense (out, in) tensor. The result replaces
        the dense tensor, so the weight is held once, and ``numel() * element_size()`` is its size in
        bytes: float backends keep the logical shape and dtype; a quantized one (``kernels/quant``)
        returns packed uint8 rows (out, row_bytes)."""

    @abc.abstractmethod
    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """y = x W^T + b. x (..., in) in the weight's dtype; weight from ``prepare``; bias (out,) or
        None. Returns (..., out)."""

    def fused_kind(self, weight: torch.Tensor, rows: int, dtype: torch.dtype) -> Optional[int]:
        """How the C++ decoder-layer op (``kernels/decoder``) runs this linear so that it computes
        exactly what ``linear`` does for ``rows`` rows of ``dtype`` x and no bias: a quantized format
        code (>= 0, ``radixlm_cpu::quant_linear``), ``FUSED_PACKED`` (``radixlm_cpu::linear_packed``)
        or ``FUSED_DENSE`` (``aten::linear`` on the dense weight); None where it cannot (the model
        then runs its layers module by module)."""
        return None


    def swiglu_fusable(self, weight: torch.Tensor) -> bool:
        """Whether this backend runs a SwiGLU gate-up weight (2I, in): gate rows then up rows, dense,
        as loaded) with the SiLU-and-mul fused (``prepare_gate_up`` / ``linear_silu_mul``)."""
        return False

    def prepare_gate_up(self, weight: torch.Tensor) -> torch.Tensor:
        """The fused form of a gate-up weight (only where ``swiglu_fusable``)."""
        raise NotImplementedError(f"{self.name}: no fused gate-up")

    def linear_silu_mul(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """silu(x Wg^T) * (x Wu^T) for a weight from ``prepare_gate_up``: x (..., in) -> (..., I), the
        same bits as ``silu_and_mul(linear(x, W))`` with the C++ elementwise backend."""
        raise NotImplementedError(f"{self.name}: no fused gate-up")


FUSED_PACKED = -1  # fused_kind: a weight from pack_linear_weight
FUSED_DENSE = -2  # fused_kind: a dense (out, in) weight
FUSED_SWIGLU = -3  # a gate-up weight from prepare_gate_up (radixlm_cpu::linear_packed_silu_mul, no SiLU pass)
