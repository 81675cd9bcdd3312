"""Elementwise-op backend interface: the fused per-layer ops around attention and the MLP
(SGLang's ``fused_add_rmsnorm`` / rotary embedding / ``silu_and_mul`` kernels).

Shapes: hidden states (T, N); q (T, H, D), k (T, KVH, D) with unit stride in D (views into a fused
qkv projection are accepted); cos, sin (T, D) in q's dtype; MLP input (T, 2 * I). Every op keeps the
input dtype and returns new contiguous tensors unless it says in place.
"""

from __future__ import annotations

import abc
from typing import Optional

import torch


class ElementwiseBackend(abc.ABC):
    name = ""

    @abc.abstractmethod
    def add_rms_norm(self, h: torch.Tensor, delta: Optional[torch.Tensor], weight: torch.Tensor,
                     eps: float) -> torch.Tensor:
        """``h += delta`` in place (skipped when delta is None), then returns
        ``weight * h / sqrt(mean(h ** 2, -1) + eps)``, the statistics in fp32 (HF LlamaRMSNorm)."""

    @abc.abstractmethod
    def rope(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x * cos + rotate_half(x) * sin`` for q and k (Su et al. 2021, HF's rotate-half layout)."""

    @abc.abstractmethod
    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """``silu(x[:, :I]) * x[:, I:]`` (SwiGLU, Shazeer 2020) for x (T, 2I)."""
