"""Elementwise-op backends (RMSNorm with the residual add, RoPE, SiLU-and-mul), chosen by name
(``--elementwise-backend``)."""

from __future__ import annotations

import torch

from radixlm.kernels.elementwise.base import ElementwiseBackend


def create_elementwise_backend(name: str, device: torch.device) -> ElementwiseBackend:
    """``auto`` picks the fused C++ kernels on CPU (torch_native, with a warning, when they cannot be
    built) and torch_native elsewhere.

    Raises:
        ValueError: an unknown name, or cpu asked for on another device.
        CpuKernelsUnavailable: cpu asked for where the C++ kernels cannot be built.
    """
    from radixlm.kernels.elementwise.torch_native import TorchNativeElementwise

    if name == "auto":
        name = "torch_native"
        if device.type == "cpu":
            from radixlm.kernels.cpu_extension import cpu_or_torch_native

            name = cpu_or_torch_native("elementwise ops")
    if name == "torch_native":
        return TorchNativeElementwise()
    if name == "cpu":
        if device.type != "cpu":
            raise ValueError("the cpu elementwise backend needs --device cpu")
        from radixlm.kernels.elementwise.cpu import CpuElementwise

        return CpuElementwise()
    raise ValueError(f"unknown elementwise backend {name!r}; expected auto, torch_native or cpu")
