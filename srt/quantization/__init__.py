"""Which linear layers of a loaded model keep quantized weights, and in which format (``--quantization``).

- ``none``: every linear multiplies the float weights (the reference; HF-equality tests run it).
- ``int8``: every linear (and the LM head) whose in_features is a multiple of 32 is quantized at load,
  weight-only, symmetric per output channel (any model, any source).
- ``gguf``: the model came from a GGUF file; each linear whose GGUF tensors are Q8_0, Q4_0 or Q4_1 keeps
  the file's blocks as they are (``gguf_blocks.py``); other types (F32, F16, K-quants...) stay the
  float weights the file was converted to.
- default (``None``, "auto"): ``gguf`` when the model path is a GGUF file (the demo model included),
  else ``none`` (also for the fp32 folder a GGUF was converted to, which HF-equality tests load; an
  explicit ``gguf`` finds the file from that folder).

``plan_quantization`` returns the GEMM backend of each quantized layer; the model runner hands every
other layer its usual backend. Embedding tables stay float (a lookup reads a few rows). The decode
kernel takes the model's activations as they are, fp32 or (4-bit blocks on AVX512-BF16) bf16, never
8-bit (kernels/quant/gemm.py says why).
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from radixlm.kernels.gemm.base import GemmBackend
from radixlm.srt.server_args import QUANTIZATION_METHODS

PROVENANCE_FILE = "radixlm_gguf_source.json"  # written by model_loader next to a converted GGUF
logger = logging.getLogger(__name__)


@dataclass
class QuantizationPlan:
    """``method``: the resolved method; ``backends``: layer -> its quantized GEMM backend;
    ``layers``: how many linear layers ended up in each format (``dense`` = kept float)."""

    method: str = "none"
    backends: dict[nn.Module, GemmBackend] = field(default_factory=dict)
    layers: dict[str, int] = field(default_factory=dict)


def gguf_source(model_path: Optional[str], converted: bool = False) -> Optional[Path]:
    """The GGUF file a model path names (``None``: the demo model's), or None when it is not a GGUF.
    With ``converted``, also the source of a folder radixlm converted from a GGUF (its
    ``radixlm_gguf_source.json``; the server hands its scheduler the converted folder).

    Raises:
        ModelLoadError: the demo model is asked for but not installed.
    """
    from radixlm.srt.model_loader import find_demo_model

    if model_path is None:
        return Path(find_demo_model())
    path = Path(os.path.expanduser(str(model_path)))
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path.resolve()
    if path.is_dir() and not (path / "config.json").exists():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0].resolve()
    provenance = path / PROVENANCE_FILE
    if converted and provenance.is_file():
        source = Path(json.loads(provenance.read_text())["source"])
        return source if source.is_file() else None
    return None


def resolve_quantization(method: Optional[str], model_path: Optional[str], device: torch.device) -> str:
    """``none``, ``int8`` or ``gguf`` for a ``--quantization`` value (None: auto, see the module docstring).

    Raises:
        ValueError: an unknown method, ``gguf`` for a model that is not a GGUF file, or a quantized
            method on a device without the kernels (CUDA).
    """
    if method is None:
        if device.type != "cpu" or gguf_source(model_path) is None:
            return "none"
        from radixlm.kernels.cpu_extension import cpu_kernels_error

        error = cpu_kernels_error()
        if error is not None:
            logger.warning("GGUF weights are dequantized to float: %s", error)
            return "none"
        return "gguf"
    method = method.lower()
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"--quantization must be one of {', '.join(QUANTIZATION_METHODS)}, got {method!r}")
    if method != "none" and device.type != "cpu":
        raise ValueError(f"--quantization {method} runs on CPU only (its kernels are C++ CPU kernels); "
                         f"got --device {device.type}")
    if method == "gguf" and gguf_source(model_path, converted=True) is None:
        raise ValueError(f"--quantization gguf keeps a GGUF file's blocks, but the model path {model_path!r} "
                         "is not a .gguf file; use --quantization int8 for other models")
    return method


def plan_quantization(model: nn.Module, method: str, model_path: Optional[str], tp) -> QuantizationPlan:
    """The quantized backend of each linear layer of a loaded ``model`` for a resolved ``method``.

    Raises:
        ModelLoadError: (gguf) the file's blocks do not match the model or its converted weights.
        CpuKernelsUnavailable: the C++ kernels cannot be built.
    """
    plan = QuantizationPlan(method=method)
    if method == "int8":
        _plan_int8(model, plan)
    elif method == "gguf":
        from radixlm.srt.quantization.gguf_blocks import plan_gguf

        plan_gguf(model, gguf_source(model_path, converted=True), tp, plan)
    if method != "none":
        logger.info("quantization %s: linear layers per format %s", method, plan.layers)
    return plan


def linear_layers(model: nn.Module) -> list[nn.Module]:
    """The modules whose weight goes through a GEMM backend (linears and the LM head)."""
    return [m for m in model.modules() if hasattr(m, "process_weights_after_loading")]


def _plan_int8(model: nn.Module, plan: QuantizationPlan) -> None:
    from radixlm.kernels.quant.gemm import QuantGemm

    counts: Counter = Counter()
    for layer in linear_layers(model):
        in_features = layer.weight.shape[1]
        if in_features % 32:
            counts["dense"] += 1
            continue
        plan.backends[layer] = QuantGemm("int8", in_features)
        counts["int8"] += 1
    plan.layers = dict(counts)
