"""Attention backends, chosen by name (``--attention-backend``)."""

from __future__ import annotations

from typing import Any


def create_attention_backend(name: str, device: str, dtype: Any = None, **kwargs: Any):
    """Return an ``AttentionBackend``. ``auto`` picks flashinfer on CUDA when it is installed and
    supports the head size and dtype, else torch_native; on CPU it picks the ``cpu`` C++ kernel
    (built on first use; docs/benchmarks.md has its figures against torch_native), falling back to
    torch_native with a warning when the kernel cannot be built here (no C++ compiler).

    Raises:
        ValueError: an unknown name, or flashinfer asked for where it cannot run.
    """
    if name == "auto":
        name = "torch_native"
        if device == "cpu":
            from radixlm.kernels.cpu_extension import cpu_or_torch_native

            name = cpu_or_torch_native("attention")
        elif device.startswith("cuda"):
            try:
                import flashinfer  # noqa: F401

                from radixlm.kernels.attention.flashinfer_backend import flashinfer_supports

                if flashinfer_supports(kwargs["head_dim"], dtype):
                    name = "flashinfer"
            except ImportError:
                pass
    if name == "torch_native":
        from radixlm.kernels.attention.torch_native import TorchNativeAttnBackend

        return TorchNativeAttnBackend(**kwargs)
    if name == "cpu":
        if device != "cpu":
            raise ValueError("the cpu attention backend needs --device cpu")
        from radixlm.kernels.attention.cpu_backend import CpuAttnBackend

        return CpuAttnBackend(**kwargs)
    if name == "flashinfer":
        if not device.startswith("cuda"):
            raise ValueError("the flashinfer attention backend needs --device cuda")
        from radixlm.kernels.attention.flashinfer_backend import FlashInferAttnBackend

        return FlashInferAttnBackend(**kwargs)
    raise ValueError(f"unknown attention backend {name!r}")
