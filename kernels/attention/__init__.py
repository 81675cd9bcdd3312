"""Attention backends, chosen by name (``--attention-backend``)."""

from __future__ import annotations

from typing import Any


def create_attention_backend(name: str, device: str, dtype: Any = None, **kwargs: Any):
    """Return an ``AttentionBackend``. ``auto`` picks flashinfer on CUDA when it is installed and
    supports the head size and dtype, else torch_native. The ``cpu`` C++ kernel is opt-in: it decodes
    faster without shared prefixes (SmolLM2, batch 32 over 512-token contexts: 1.33x), but loses to
    torch_native's cascade blocks on shared-prefix batches (64 requests on 4 prefixes of 512 tokens:
    prefill 20.2 vs 11.2 s, decode 514 vs 369 ms/step; docs/benchmarks.md).

    Raises:
        ValueError: an unknown name, or flashinfer asked for where it cannot run.
    """
    if name == "auto":
        name = "torch_native"
        if device.startswith("cuda"):
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
