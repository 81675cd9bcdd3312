"""Pure-PyTorch paged attention: the CPU backend and the test oracle.

Follows SGLang's ``torch_native_backend.py``: K/V are stored at ``out_cache_loc``, then for each
request its keys and values are gathered through ``req_to_token[row, :seq_len]`` and attended with
``scaled_dot_product_attention`` (GQA via ``enable_gqa``). A Python loop per request keeps every
row's result independent of what else is in the batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from radixlm.kernels.attention.base import AttentionBackend

if TYPE_CHECKING:
    from radixlm.srt.forward_batch import ForwardBatch


class TorchNativeAttnBackend(AttentionBackend):
    """Paged attention with torch SDPA.

    Args:
        num_heads, num_kv_heads, head_dim: of this rank's attention layers.
        scaling: softmax scale (usually head_dim ** -0.5).
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scaling: float):
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scaling = scaling

    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        # Slot lists per request, gathered once per batch and shared by all layers.
        rows = forward_batch.req_pool_indices.tolist()
        table = forward_batch.req_to_token_pool.req_to_token
        forward_batch.attn_metadata = [table[r, :n] for r, n in zip(rows, forward_batch.seq_lens)]

    def _store(self, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: "ForwardBatch") -> None:
        fb.kv_pool.set_kv(layer_id, fb.out_cache_loc,
                          k.view(-1, self.num_kv_heads, self.head_dim),
                          v.view(-1, self.num_kv_heads, self.head_dim))

    def forward_extend(self, q, k, v, layer_id, forward_batch):
        fb = forward_batch
        self._store(k, v, layer_id, fb)
        k_buf, v_buf = fb.kv_pool.get_kv(layer_id)
        q = q.view(-1, self.num_heads, self.head_dim)
        out = torch.empty_like(q)
        start = 0
        for slots, prefix, ext in zip(fb.attn_metadata, fb.prefix_lens, fb.extend_lens):
            qi = q[start:start + ext].transpose(0, 1)  # (H, ext, D)
            ki = k_buf[slots].transpose(0, 1)  # (KVH, seq, D)
            vi = v_buf[slots].transpose(0, 1)
            if prefix == 0:
                o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=self.scaling,
                                                   enable_gqa=self.num_heads != self.num_kv_heads)
            else:
                # Query i sits at absolute position prefix + i and sees keys 0..prefix + i.
                seq = prefix + ext
                mask = torch.ones(ext, seq, dtype=torch.bool, device=q.device).tril(diagonal=prefix)
                o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=self.scaling,
                                                   enable_gqa=self.num_heads != self.num_kv_heads)
            out[start:start + ext] = o.transpose(0, 1)
            start += ext
        return out.view(-1, self.num_heads * self.head_dim)

    def forward_decode(self, q, k, v, layer_id, forward_batch):
        fb = forward_batch
        self._store(k, v, layer_id, fb)
        k_buf, v_buf = fb.kv_pool.get_kv(layer_id)
        q = q.view(-1, self.num_heads, 1, self.head_dim)
        out = torch.empty_like(q)
        for i, slots in enumerate(fb.attn_metadata):
            ki = k_buf[slots].transpose(0, 1)
            vi = v_buf[slots].transpose(0, 1)
            out[i] = F.scaled_dot_product_attention(q[i], ki, vi, scale=self.scaling,
                                                    enable_gqa=self.num_heads != self.num_kv_heads)
        return out.view(-1, self.num_heads * self.head_dim)
