"""GEMM backends (kernels/gemm): prepacked oneDNN linears equal F.linear on the dense weight."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlm.kernels.gemm import create_gemm_backend
from radixlm.kernels.gemm.onednn import OneDnnGemm, onednn_supports
from radixlm.kernels.gemm.torch_native import TorchNativeGemm

CPU = torch.device("cpu")
needs_onednn = pytest.mark.skipif(not onednn_supports(torch.float32), reason="oneDNN is not available")


@needs_onednn
@pytest.mark.parametrize("rows", [1, 3, 64, 301])
@pytest.mark.parametrize("bias", [False, True])
def test_onednn_linear_equals_f_linear_fp32(rows, bias):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 40, generator=g)
    b = torch.randn(96, generator=g) if bias else None
    x = torch.randn(rows, 40, generator=g)
    gemm = OneDnnGemm()
    packed = gemm.prepare(w.clone())
    assert packed.is_mkldnn and packed.shape == w.shape and packed.numel() == w.numel()
    y = gemm.linear(x, packed, b)
    ref = F.linear(x, w, b)
    assert y.shape == ref.shape and y.dtype == torch.float32
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    assert not torch.equal(y, torch.zeros_like(y))


@needs_onednn
def test_onednn_linear_keeps_leading_dims_and_non_contiguous_input():
    w = torch.randn(24, 16)
    gemm = OneDnnGemm()
    packed = gemm.prepare(w)
    x = torch.randn(16, 2, 5).permute(1, 2, 0)  # (2, 5, 16), not contiguous
    torch.testing.assert_close(gemm.linear(x, packed), F.linear(x, w), rtol=1e-5, atol=1e-5)
    assert gemm.prepare(packed) is packed  # preparing twice is a no-op


@pytest.mark.skipif(not onednn_supports(torch.bfloat16), reason="oneDNN has no bf16 GEMM on this CPU")
def test_onednn_linear_bf16():
    w = torch.randn(64, 32).bfloat16()
    x = torch.randn(7, 32).bfloat16()
    gemm = OneDnnGemm()
    y = gemm.linear(x, gemm.prepare(w))
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), F.linear(x.float(), w.float()), rtol=2e-2, atol=2e-2)


def test_create_gemm_backend_choices():
    auto = create_gemm_backend("auto", CPU, torch.float32)
    assert auto.name == ("onednn" if onednn_supports(torch.float32) else "torch_native")
    assert create_gemm_backend("auto", CPU, torch.bfloat16).name == (
        "onednn" if onednn_supports(torch.bfloat16) else "torch_native")
    assert isinstance(create_gemm_backend("torch_native", CPU, torch.float32), TorchNativeGemm)
    assert create_gemm_backend("auto", torch.device("cuda"), torch.float32).name == "torch_native"
    with pytest.raises(ValueError, match="unknown GEMM backend"):
        create_gemm_backend("cublas", CPU, torch.float32)
    with pytest.raises(ValueError, match="--device cpu"):
        create_gemm_backend("onednn", torch.device("cuda"), torch.float32)
    if not onednn_supports(torch.float16):
        with pytest.raises(ValueError, match="torch_native"):
            create_gemm_backend("onednn", CPU, torch.float16)


@needs_onednn
def test_model_runner_prepacks_every_linear(stories_path):
    from radixlm.srt.engine import Engine
    from radixlm.srt.layers.linear import ColumnParallelLinear, ParallelLMHead, RowParallelLinear

    engine = Engine(stories_path, max_total_tokens=512)
    runner = engine.worker.model_runner
    assert runner.gemm_backend.name == "onednn"
    linears = [m for m in runner.model.modules()
               if isinstance(m, (ColumnParallelLinear, RowParallelLinear, ParallelLMHead))]
    assert len(linears) == 4 * runner.model_config.num_hidden_layers + 1
    assert all(m.weight.is_mkldnn and m.gemm is runner.gemm_backend for m in linears)
    assert not runner.model.embed_tokens.weight.is_mkldnn  # the embedding lookup keeps its dense table
    reference = Engine(stories_path, max_total_tokens=512, gemm_backend="torch_native")
    assert not any(m.weight.is_mkldnn for m in reference.worker.model_runner.model.modules()
                   if isinstance(m, (ColumnParallelLinear, RowParallelLinear, ParallelLMHead)))
