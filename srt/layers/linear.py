"""Megatron-style tensor-parallel linear layers and vocab-parallel embedding / LM head.

Each layer holds only this rank's shard and knows how to load its shard from a full Hugging Face
weight (``weight_loader(param, full_weight, shard_id)``). With ``tp.size == 1`` they are plain
linears. Weights: (out_features_per_rank, in_features_per_rank). After loading,
``process_weights_after_loading(gemm)`` hands each weight to a ``GemmBackend`` (``kernels/gemm``),
which may replace it with a prepacked form; until then the layers multiply with ``F.linear``.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels.gemm.base import GemmBackend
from radixlm.kernels.gemm.torch_native import TorchNativeGemm
from radixlm.srt.layers.parallel_state import TpGroup

_REFERENCE_GEMM = TorchNativeGemm()


def _divide(a: int, b: int, what: str) -> int:
    if a % b:
        raise ValueError(f"{what} ({a}) is not divisible by the tensor-parallel size ({b})")
    return a // b


class ColumnParallelLinear(nn.Module):
    """y = x W^T (+ b); W split along the output dimension. Output stays sharded."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TpGroup, dtype: torch.dtype):
        super().__init__()
        self.tp = tp
        self.out_per_rank = _divide(out_features, tp.size, "output features")
        self.weight = nn.Parameter(torch.empty(self.out_per_rank, in_features, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(self.out_per_rank, dtype=dtype), requires_grad=False) if bias else None
        self.gemm: GemmBackend = _REFERENCE_GEMM

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gemm.linear(x, self.weight, self.bias)

    def process_weights_after_loading(self, gemm: GemmBackend) -> None:
        _prepare(self, gemm)

    def load_shard(self, param: nn.Parameter, full: torch.Tensor, offset: int, size: int) -> None:
        """Copy rows [rank*size, (rank+1)*size) of ``full`` into ``param[offset:offset+size]``."""
        shard = full.narrow(0, self.tp.rank * size, size)
        param.data[offset:offset + size].copy_(shard)

    def weight_loader(self, param: nn.Parameter, full: torch.Tensor, shard_id: Optional[str] = None) -> None:
        self.load_shard(param, full, 0, self.out_per_rank)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs stacked in one matmul (e.g. gate_proj and up_proj).

    A SwiGLU gate-up (``[I, I]``, no bias) also offers ``silu_and_mul(x, elementwise)``, silu(gate) * up:
    fused into the GEMM where the backend can (``GemmBackend.swiglu_fusable``; its weight is then stored
    in the backend's own layout and ``forward`` is not available), else ``elementwise.silu_and_mul``
    of ``forward``.
    """

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool, tp: TpGroup, dtype: torch.dtype):
        super().__init__(in_features, sum(out_sizes), bias, tp, dtype)
        self.per_rank = [_divide(s, tp.size, "output features") for s in out_sizes]
        self.fused_swiglu = False

    def process_weights_after_loading(self, gemm: GemmBackend) -> None:
        swiglu = len(self.per_rank) == 2 and self.per_rank[0] == self.per_rank[1] and self.bias is None
        if swiglu and gemm.swiglu_fusable(self.weight.data):
            self.weight = nn.Parameter(gemm.prepare_gate_up(self.weight.data), requires_grad=False)
            self.gemm, self.fused_swiglu = gemm, True
            return
        _prepare(self, gemm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_swiglu:
            raise RuntimeError("this gate-up weight is stored fused with its SiLU-and-mul: call silu_and_mul")
        return super().forward(x)

    def silu_and_mul(self, x: torch.Tensor, elementwise: Any) -> torch.Tensor:
        """silu(x Wg^T) * (x Wu^T): (..., in) -> (..., I); ``elementwise`` runs it where not fused."""
        if self.fused_swiglu:
            return self.gemm.linear_silu_mul(x, self.weight)
        return elementwise.silu_and_mul(super().forward(x))

    def weight_loader(self, param: nn.Parameter, full: torch.Tensor, shard_id: Optional[str] = None) -> None:
        idx = int(shard_id)  # type: ignore[arg-type]
        offset = sum(self.per_rank[:idx])
        self.load_shard(param, full, offset, self.per_rank[idx])


class QKVParallelLinear(ColumnParallelLinear):
    """Stacked Q, K, V projections; heads split over ranks, KV heads replicated when fewer than ranks."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool,
                 tp: TpGroup, dtype: torch.dtype):
        self.num_heads = _divide(num_heads, tp.size, "attention heads")
        if num_kv_heads >= tp.size:
            self.num_kv_heads = _divide(num_kv_heads, tp.size, "KV heads")
            self.kv_replicas = 1
        else:
            self.kv_replicas = _divide(tp.size, num_kv_heads, "tensor-parallel size over KV heads")
            self.num_kv_heads = 1
        self.head_dim = head_dim
        total = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp.size
        super().__init__(hidden, total, bias, tp, dtype)
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim

    def weight_loader(self, param: nn.Parameter, full: torch.Tensor, shard_id: Optional[str] = None) -> None:
        if shard_id == "q":
            self.load_shard(param, full, 0, self.q_size)
            return
        offset = self.q_size if shard_id == "k" else self.q_size + self.kv_size
        kv_rank = self.tp.rank // self.kv_replicas
        param.data[offset:offset + self.kv_size].copy_(full.narrow(0, kv_rank * self.kv_size, self.kv_size))


class RowParallelLinear(nn.Module):
    """y = x W^T (+ b); W split along the input dimension; partial sums all-reduced."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TpGroup, dtype: torch.dtype):
        super().__init__()
        self.tp = tp
        self.in_per_rank = _divide(in_features, tp.size, "input features")
        self.weight = nn.Parameter(torch.empty(out_features, self.in_per_rank, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype), requires_grad=False) if bias else None
        self.gemm: GemmBackend = _REFERENCE_GEMM

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.all_reduce(self.gemm.linear(x, self.weight))
        return y + self.bias if self.bias is not None else y

    def process_weights_after_loading(self, gemm: GemmBackend) -> None:
        _prepare(self, gemm)

    def weight_loader(self, param: nn.Parameter, full: torch.Tensor, shard_id: Optional[str] = None) -> None:
        if full.dim() == 1:  # bias: not sharded
            param.data.copy_(full)
            return
        param.data.copy_(full.narrow(1, self.tp.rank * self.in_per_rank, self.in_per_rank))


class VocabParallelEmbedding(nn.Module):
    """Embedding with the vocabulary split over ranks; out-of-shard ids contribute zeros, then all-reduce."""

    def __init__(self, vocab_size: int, hidden: int, tp: TpGroup, dtype: torch.dtype):
        super().__init__()
        self.tp = tp
        self.vocab_per_rank = -(-vocab_size // tp.size)
        self.vocab_size = vocab_size
        self.start = tp.rank * self.vocab_per_rank
        self.weight = nn.Parameter(torch.zeros(self.vocab_per_rank, hidden, dtype=dtype), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        valid = (local >= 0) & (local < self.vocab_per_rank)
        out = F.embedding(local.clamp(0, self.vocab_per_rank - 1), self.weight)
        out = out * valid.unsqueeze(-1).to(out.dtype)
        return self.tp.all_reduce(out)

    def weight_loader(self, param: nn.Parameter, full: torch.Tensor, shard_id: Optional[str] = None) -> None:
        shard = full[self.start:self.start + self.vocab_per_rank]
        param.data[:shard.shape[0]].copy_(shard)


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states to vocabulary logits; shards all-gathered to (N, vocab_size)."""

    gemm: GemmBackend = _REFERENCE_GEMM

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        out = self.tp.all_gather_last_dim(self.gemm.linear(hidden, self.weight))
        return out[..., :self.vocab_size]

    def process_weights_after_loading(self, gemm: GemmBackend) -> None:
        _prepare(self, gemm)


def _prepare(layer: nn.Module, gemm: GemmBackend) -> None:
    """Replace ``layer.weight`` by ``gemm``'s form of it and multiply with ``gemm`` from now on."""
    layer.weight = nn.Parameter(gemm.prepare(layer.weight.data), requires_grad=False)
    layer.gemm = gemm
