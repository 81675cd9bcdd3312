"""GEMM (linear layer) backends, chosen by name (``--gemm-backend``)."""

from __future__ import annotations

import torch

from radixlm.kernels.gemm.base import GemmBackend


def bf16_pairs_preferred(info, capability: str) -> bool:
    """Whether ``auto`` takes the cpu kernel's bf16 pair panels for bf16: an AVX-512 build
    (``capability``: torch.backends.cpu.get_cpu_capability()) on a CPU (``info``: a CpuInfo) with
    AVX512-BF16. They are multiplied with vdpbf16ps, or with AMX's TDPBF16PS where the CPU has
    AMX-BF16 (and K is a multiple of 32): batch-invariant either way; on a 2-core AMX Xeon (model 207)
    ~1.5x oneDNN's prepacked bf16 GEMM at 1-32 rows, 1.1-1.2x at 64-128 and 0.8-1.0x at 512
    (docs/benchmarks.md), and faster end to end there (the decoder stack runs with it)."""
    return capability.startswith("AVX512") and "avx512_bf16" in info.flags


def create_gemm_backend(name: str, device: torch.device, dtype: torch.dtype) -> GemmBackend:
    """Return a ``GemmBackend``. ``auto`` on CPU: for fp32 and bf16, radixlm's packed-panel C++
    kernel (``cpu``: batch-invariant; bf16 on vdpbf16ps / AMX tiles where the CPU has them) when it
    builds here, except bf16 on an AVX2 build of torch for a CPU with bf16 units;
    else onednn where oneDNN supports ``dtype`` with a packed-weight kernel (fp32 anywhere oneDNN runs;
    bf16/fp16 only with the vector units oneDNN needs for them); else torch_native. Elsewhere
    torch_native.

    Raises:
        ValueError: an unknown name, or onednn / cpu asked for where it cannot run.
        CpuKernelsUnavailable: cpu asked for where the C++ kernels cannot be built.
    """
    from radixlm.kernels.gemm.onednn import onednn_supports
    from radixlm.kernels.gemm.torch_native import TorchNativeGemm

    if name == "auto":
        name = "torch_native"
        if device.type == "cpu":
            from radixlm.srt.cpu_runtime import cpu_info, prefers_bf16

            # bf16 without native bf16 units: oneDNN emulates it with blockings that depend on M, so
            # greedy output would depend on the batch; the cpu kernel's fp32 chains do not. With
            # AVX512-BF16 the cpu kernel's vdpbf16ps tiles (with AMX its TDPBF16PS tiles) are
            # batch-invariant too, and faster than oneDNN's at decode's row counts though behind at
            # prefill's (bench_gemm.py, docs/benchmarks.md): oneDNN's own choice of kernel
            # changes with M, so with it bf16 greedy output would depend on the batch.
            info = cpu_info()
            pairs = bf16_pairs_preferred(info, torch.backends.cpu.get_cpu_capability())
            if dtype == torch.float32 or (dtype == torch.bfloat16 and (not prefers_bf16(info) or pairs)):
                from radixlm.kernels.cpu_extension import cpu_kernels_error

                name = "cpu" if cpu_kernels_error() is None else name
            if name == "torch_native" and onednn_supports(dtype):
                name = "onednn"
    if name == "cpu":
        if device.type != "cpu":
            raise ValueError("the cpu GEMM backend needs --device cpu")
        from radixlm.kernels.gemm.cpu import CpuGemm

        return CpuGemm()
    if name == "torch_native":
        return TorchNativeGemm()
    if name == "onednn":
        if device.type != "cpu" or not onednn_supports(dtype):
            raise ValueError(f"the onednn GEMM backend needs --device cpu and a dtype oneDNN packs on this CPU "
                             f"(got {device.type}, {dtype}); use --gemm-backend torch_native")
        from radixlm.kernels.gemm.onednn import OneDnnGemm

        return OneDnnGemm()
    raise ValueError(f"unknown GEMM backend {name!r}; expected auto, torch_native, onednn or cpu")
