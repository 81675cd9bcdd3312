"""RMSNorm and rotary position embedding, computed as Hugging Face transformers does.

The arithmetic is an ``ElementwiseBackend``'s (``kernels/elementwise``): the torch reference ops by
default, the fused C++ kernels once the model runner hands the layers ``--elementwise-backend``'s
choice (``elementwise`` attributes, like the linears' ``gemm``).

RoPE frequencies come from transformers' own ``ROPE_INIT_FUNCTIONS`` (default, llama3, linear,
yarn, ...) so every rope scaling type matches the reference implementation.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from radixlm.kernels.elementwise.base import ElementwiseBackend
from radixlm.kernels.elementwise.torch_native import TorchNativeElementwise

REFERENCE_ELEMENTWISE = TorchNativeElementwise()


class RMSNorm(nn.Module):
    """y = w * x / sqrt(mean(x^2) + eps), computed in fp32 (Zhang & Sennrich 2019; HF LlamaRMSNorm).

    ``forward(x, residual_delta)`` first adds ``residual_delta`` into x in place (the decoder's
    residual add, fused with the norm), then normalises; x (..., hidden).
    """

    def __init__(self, hidden: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=dtype), requires_grad=False)
        self.eps = eps
        self.elementwise: ElementwiseBackend = REFERENCE_ELEMENTWISE

    def forward(self, x: torch.Tensor, residual_delta: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.elementwise.add_rms_norm(x, residual_delta, self.weight, self.eps)


def rope_inv_freq(hf_config, head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (head_dim // 2,) float32 and the attention scaling factor."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        base = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        return inv, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu")


class RotaryEmbedding(nn.Module):
    """Applies RoPE (Su et al. 2021) in HF's rotate-half layout to q and k of shape (T, heads, head_dim).

    One instance is shared by all layers of a model: cos/sin of a forward's ``positions`` are
    computed by the first layer and reused by the others (memoised on the positions tensor object;
    the model calls ``reset()`` at the start of each forward), with the same float32 ops as HF, so
    the values are bit-identical to transformers'.
    """

    def __init__(self, hf_config, head_dim: int):
        super().__init__()
        inv_freq, self.scaling = rope_inv_freq(hf_config, head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._memo: tuple = (None, None, None)
        self.elementwise: ElementwiseBackend = REFERENCE_ELEMENTWISE

    def reset(self) -> None:
        """Forget the memoised cos/sin (a new forward, whose positions may reuse a buffer)."""
        self._memo = (None, None, None)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin: (T, head_dim) contiguous in ``dtype`` for positions (T,) int64."""
        last, cos, sin = self._memo
        if last is positions and cos.dtype == dtype:
            return cos, sin
        freqs = positions.float()[:, None] * self.inv_freq.to(positions.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.scaling).to(dtype)
        sin = (emb.sin() * self.scaling).to(dtype)
        self._memo = (positions, cos, sin)
        return cos, sin

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q (T, H, D), k (T, KVH, D) (unit stride in D) -> rotated (q, k), new tensors."""
        cos, sin = self.cos_sin(positions, q.dtype)
        return self.elementwise.rope(q, k, cos, sin)
