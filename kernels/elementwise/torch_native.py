"""The reference elementwise ops: the same torch ops as Hugging Face transformers' Llama."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from radixlm.kernels.elementwise.base import ElementwiseBackend


class TorchNativeElementwise(ElementwiseBackend):
    name = "torch_native"

    def add_rms_norm(self, h: torch.Tensor, delta: Optional[torch.Tensor], weight: torch.Tensor,
                     eps: float) -> torch.Tensor:
        if delta is not None:
            h.add_(delta)
        x = h.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return weight * x.to(h.dtype)

    def rope(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = cos[:, None, :], sin[:, None, :]
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
