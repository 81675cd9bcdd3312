"""CPU attention: the whole batch's paged attention in one C++ kernel call per layer.

The torch_native path runs a layer's attention as many small torch ops (gather K/V into padded
blocks, matmul, mask, softmax, matmul), each an OpenMP region of its own; such regions stall when
another process holds a core, and the gather copies every request's K/V once more per layer.
``torch.ops.radixlm_cpu.paged_attention`` (``cpu/paged_attention.cpp``) stores the new K/V and
attends over the paged pool in place, for extend and decode batches alike, in one parallel region.

Every query row runs the same sequence of operations wherever it is computed (see the kernel), so a
token's attention output is bitwise the same in a prefill, a chunk, a decode step and any batch:
greedy output does not depend on batching, chunking or radix-cache hits, in bf16 as in fp32
(SGLang's ``--enable-deterministic-inference`` property, here by construction and at no cost).

Shared prefixes (radix-cache hits on one prefix) run as cascade: the kernel reads each group's
prefix K/V once for all of the group's queries (``kernels/attention/cascade.py`` finds the groups;
the shared length is cut to a multiple of the kernel's 128-key block, which keeps the output bitwise
the same as without cascade).

The KV pool is head-major (``KVPool`` layout ``"HND"``), as for torch_native.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixlm.kernels.attention.base import AttentionBackend
from radixlm.kernels.attention.cascade import shared_prefix_groups
from radixlm.kernels.cpu_extension import load_cpu_kernels

if TYPE_CHECKING:
    from radixlm.srt.forward_batch import ForwardBatch

# The kernel's key block (BLOCK in cpu/paged_attention.cpp): cascade prefixes are whole blocks.
KERNEL_BLOCK = 128


class CpuAttnBackend(AttentionBackend):
    """Args: num_heads, num_kv_heads, head_dim of this rank's layers; scaling (softmax scale).

    Raises:
        CpuKernelsUnavailable: the C++ kernels cannot be built here.
    """

    name = "cpu"
    kv_layout = "HND"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scaling: float):
        load_cpu_kernels()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scaling = scaling
        self._op = torch.ops.radixlm_cpu.paged_attention

    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        fb = forward_batch
        groups = [(p, idx) for p, idx in shared_prefix_groups(fb, KERNEL_BLOCK, align=KERNEL_BLOCK) if p > 0]
        offsets = [0]
        for _, idx in groups:
            offsets.append(offsets[-1] + len(idx))

        def ints(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64)

        # prefix_lens, extend_lens (B,); cascade_reqs (N,), cascade_offsets (G + 1,), cascade_lens (G,)
        fb.attn_metadata = (ints(fb.prefix_lens), ints(fb.extend_lens), ints([i for _, idx in groups for i in idx]),
                            ints(offsets), ints([p for p, _ in groups]))

    def forward_extend(self, q, k, v, layer_id, forward_batch):
        return self._attend(q, k, v, layer_id, forward_batch)

    def forward_decode(self, q, k, v, layer_id, forward_batch):
        return self._attend(q, k, v, layer_id, forward_batch)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                fb: "ForwardBatch") -> torch.Tensor:
        k_buf, v_buf = fb.kv_pool.get_kv(layer_id)
        t = q.shape[0]
        out = self._op(q.reshape(t, self.num_heads, self.head_dim).contiguous(),
                       k.reshape(t, self.num_kv_heads, self.head_dim).contiguous(),
                       v.reshape(t, self.num_kv_heads, self.head_dim).contiguous(),
                       k_buf, v_buf, fb.out_cache_loc, fb.req_to_token_pool.req_to_token, fb.req_pool_indices,
                       *fb.attn_metadata, self.scaling)
        return out.view(t, -1)
