"""GEMM (linear layer) backends, chosen by name (``--gemm-backend``)."""

from __future__ import annotations

import torch

from radixlm.kernels.gemm.base import GemmBackend


def create_gemm_backend(name: str, device: torch.device, dtype: torch.dtype) -> GemmBackend:
    """Return a ``GemmBackend``. ``auto`` picks onednn on a CPU where oneDNN supports ``dtype`` with
    a packed-weight kernel (fp32 anywhere oneDNN runs; bf16/fp16 only with the vector units oneDNN
    needs for them), else torch_native.

    Raises:
        ValueError: an unknown name, or onednn asked for where it cannot run.
    """
    from radixlm.kernels.gemm.onednn import onednn_supports
    from radixlm.kernels.gemm.torch_native import TorchNativeGemm

    if name == "auto":
        name = "onednn" if device.type == "cpu" and onednn_supports(dtype) else "torch_native"
    if name == "torch_native":
        return TorchNativeGemm()
    if name == "onednn":
        if device.type != "cpu" or not onednn_supports(dtype):
            raise ValueError(f"the onednn GEMM backend needs --device cpu and a dtype oneDNN packs on this CPU "
                             f"(got {device.type}, {dtype}); use --gemm-backend torch_native")
        from radixlm.kernels.gemm.onednn import OneDnnGemm

        return OneDnnGemm()
    raise ValueError(f"unknown GEMM backend {name!r}; expected auto, torch_native or onednn")
