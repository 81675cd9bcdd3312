"""Quantized weight formats: byte layouts, and torch reference code (quantize, dequantize).

A quantized weight is a contiguous uint8 tensor (out_features, row_bytes): one row of bytes per
output feature, its in_features (K, a multiple of 32) weights in blocks of 32 along the row.

| format | row layout | a weight |
| --- | --- | --- |
| ``int8`` | fp32 scale s, then K int8 q (symmetric, per output channel) | s * q |
| ``q8_0`` | K/32 blocks of fp16 d + 32 int8 q (34 bytes; GGUF Q8_0) | d * q |
| ``q4_0`` | K/32 blocks of fp16 d + 16 bytes of nibbles (18 bytes; GGUF Q4_0) | d * (q - 8) |
| ``q4_1`` | K/32 blocks of fp16 d, fp16 m + 16 bytes of nibbles (20 bytes; GGUF Q4_1) | d * q + m |

In a 4-bit block, weight j is the low nibble of byte j and weight j + 16 the high nibble (ggml's
order), so GGUF tensors are used byte for byte. The C++ kernels (``cpu/quant_gemm.cpp``) read these
layouts; the functions here are the reference they are tested against (and what
``tests/kernels/test_quant_gemm.py`` checks against gguf-py's own numpy code).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32


@dataclass(frozen=True)
class QuantFormat:
    name: str
    code: int  # the C++ kernels' format number
    header_bytes: int  # bytes before the blocks in a row (int8: its fp32 scale)
    block_bytes: int  # bytes per block of 32 weights
    bits: int  # bits per weight in a block's values

    def row_bytes(self, in_features: int) -> int:
        """Bytes of one output row. Raises ValueError unless ``in_features`` is a positive multiple of 32."""
        check_in_features(in_features)
        return self.header_bytes + in_features // BLOCK * self.block_bytes


FORMATS: dict[str, QuantFormat] = {
    "int8": QuantFormat("int8", 0, 4, 32, 8),
    "q8_0": QuantFormat("q8_0", 1, 0, 34, 8),
    "q4_0": QuantFormat("q4_0", 2, 0, 18, 4),
    "q4_1": QuantFormat("q4_1", 3, 0, 20, 4),
}


def get_format(name: str) -> QuantFormat:
    """Raises ValueError for a name not in ``FORMATS``."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown quantized format {name!r}; expected one of {', '.join(FORMATS)}") from None


def check_in_features(in_features: int) -> None:
    if in_features <= 0 or in_features % BLOCK:
        raise ValueError(f"in_features {in_features} is not a multiple of the quantization block size {BLOCK}")


def quantize_int8(weight: torch.Tensor) -> torch.Tensor:
    """Per-output-channel symmetric int8 of a float (out, in) weight: s = max|w_row| / 127,
    q = round(w / s) (half to even). Returns the ``int8`` layout, uint8 (out, 4 + in)."""
    w = weight.detach().float()
    check_in_features(w.shape[1])
    scale = w.abs().amax(dim=1) / 127.0
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / safe[:, None]).clamp_(-127, 127).to(torch.int8)
    return torch.cat([scale.contiguous().view(torch.uint8).view(-1, 4), q.view(torch.uint8)], dim=1).contiguous()


def dequantize_reference(packed: torch.Tensor, fmt: str, in_features: int) -> torch.Tensor:
    """The fp32 (out, in) weight of ``packed`` (torch ops only; rounded as gguf-py: d * q, then + m).

    Raises ValueError when the row size does not match the format and ``in_features``.
    """
    f = get_format(fmt)
    n = packed.shape[0]
    if packed.dtype != torch.uint8 or packed.dim() != 2 or packed.shape[1] != f.row_bytes(in_features):
        raise ValueError(f"a {fmt} weight with in_features {in_features} is uint8 (out, {f.row_bytes(in_features)}), "
                         f"got {packed.dtype} {tuple(packed.shape)}")
    p = packed.contiguous()
    if f.name == "int8":
        scale = p[:, :4].contiguous().view(torch.float32)  # (n, 1)
        return p[:, 4:].contiguous().view(torch.int8).float() * scale
    blocks = p.view(n, in_features // BLOCK, f.block_bytes)
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()  # (n, nb, 1)
    if f.name == "q8_0":
        return (blocks[..., 2:].contiguous().view(torch.int8).float() * d).reshape(n, in_features)
    nibbles = blocks[..., f.block_bytes - 16:]
    q = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1).float()  # weights 0..15, then 16..31
    if f.name == "q4_0":
        return (d * (q - 8)).reshape(n, in_features)
    m = blocks[..., 2:4].contiguous().view(torch.float16).float()
    return (d * q + m).reshape(n, in_features)


def quantize_activations_reference(x: torch.Tensor) -> torch.Tensor:
    """x (M, K) fp32 as the decode kernel sees it: 8 bits per block of 32, d = max|x| / 127,
    q = round(x * (1 / d)) (half to even); returns q * d, fp32 (M, K)."""
    m, k = x.shape
    check_in_features(k)
    b = x.float().reshape(m, k // BLOCK, BLOCK)
    d = b.abs().amax(dim=-1, keepdim=True) / 127.0
    inv = torch.where(d > 0, 1.0 / torch.where(d > 0, d, torch.ones_like(d)), torch.zeros_like(d))
    return (torch.round(b * inv) * d).reshape(m, k)
