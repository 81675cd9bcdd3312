"""Pure-PyTorch paged attention: the CPU backend and the test oracle.

Follows SGLang's ``torch_native_backend.py`` in what it computes (K/V stored at ``out_cache_loc``,
then each request attends over the slots in ``req_to_token[row, :seq_len]``) but uses explicit
matmul-softmax-matmul: measured on 2 CPU cores, ``scaled_dot_product_attention`` was no faster at
these head sizes and much slower with an explicit mask. Extend runs one request at a time; decode runs the
whole batch at once over K/V gathered into a padded (bs, max_len) block, padded keys masked to -inf
(they contribute exact zeros, so a row's result does not depend on the rest of the batch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixlm.kernels.attention.base import AttentionBackend

if TYPE_CHECKING:
    from radixlm.srt.forward_batch import ForwardBatch


class TorchNativeAttnBackend(AttentionBackend):
    """Paged attention in plain torch ops; GQA by grouping query heads per KV head.

    Args:
        num_heads, num_kv_heads, head_dim: of this rank's attention layers.
        scaling: softmax scale (usually head_dim ** -0.5).
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scaling: float):
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.group = num_heads // num_kv_heads
        self.head_dim = head_dim
        self.scaling = scaling

    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        from radixlm.srt.forward_batch import ForwardMode

        fb = forward_batch
        table = fb.req_to_token_pool.req_to_token
        if fb.forward_mode is ForwardMode.DECODE:
            # (bs, max_len) slots, padded with slot 0 (dummy page); mask (bs, 1, 1, max_len).
            max_len = max(fb.seq_lens)
            slots = table.index_select(0, fb.req_pool_indices)[:, :max_len]
            lens = torch.tensor(fb.seq_lens, device=slots.device)
            valid = torch.arange(max_len, device=slots.device)[None, :] < lens[:, None]
            fb.attn_metadata = (slots.masked_fill(~valid, 0), valid[:, None, None, :])
            return
        meta = []
        for r, prefix, ext in zip(fb.req_pool_indices.tolist(), fb.prefix_lens, fb.extend_lens):
            seq = prefix + ext
            # Query i sits at absolute position prefix + i and sees keys 0..prefix + i.
            mask = torch.ones(ext, seq, dtype=torch.bool, device=table.device).tril(diagonal=prefix)
            meta.append((table[r, :seq], mask))
        fb.attn_metadata = meta

    def _store(self, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: "ForwardBatch") -> None:
        fb.kv_pool.set_kv(layer_id, fb.out_cache_loc,
                          k.view(-1, self.num_kv_heads, self.head_dim),
                          v.view(-1, self.num_kv_heads, self.head_dim))

    def forward_extend(self, q, k, v, layer_id, forward_batch):
        fb = forward_batch
        self._store(k, v, layer_id, fb)
        k_buf, v_buf = fb.kv_pool.get_kv(layer_id)
        h, kvh, g, d = self.num_heads, self.num_kv_heads, self.group, self.head_dim
        out = torch.empty_like(q).view(-1, h, d)
        start = 0
        for (slots, mask), ext in zip(fb.attn_metadata, fb.extend_lens):
            ki, vi = k_buf[slots], v_buf[slots]  # (seq, KVH, D)
            qi = q[start:start + ext].view(ext, kvh, g, d).permute(1, 2, 0, 3)  # (KVH, G, ext, D)
            scores = torch.matmul(qi, ki.permute(1, 2, 0)[:, None]) * self.scaling  # (KVH, G, ext, seq)
            scores.masked_fill_(~mask, float("-inf"))
            o = torch.matmul(scores.softmax(dim=-1), vi.transpose(0, 1)[:, None])  # (KVH, G, ext, D)
            out[start:start + ext] = o.permute(2, 0, 1, 3).reshape(ext, h, d)
            start += ext
        return out.view(-1, h * d)

    def forward_decode(self, q, k, v, layer_id, forward_batch):
        fb = forward_batch
        self._store(k, v, layer_id, fb)
        k_buf, v_buf = fb.kv_pool.get_kv(layer_id)
        slots, valid = fb.attn_metadata
        bs = q.shape[0]
        kvh, g, d = self.num_kv_heads, self.group, self.head_dim
        qb = q.view(bs, kvh, g, 1, d)
        kb = k_buf[slots].permute(0, 2, 3, 1)[:, :, None]  # (bs, KVH, 1, D, L)
        vb = v_buf[slots].transpose(1, 2)[:, :, None]  # (bs, KVH, 1, L, D)
        scores = torch.matmul(qb, kb) * self.scaling  # (bs, KVH, G, 1, L)
        scores.masked_fill_(~valid[:, :, None], float("-inf"))
        o = torch.matmul(scores.softmax(dim=-1), vb)  # (bs, KVH, G, 1, D)
        return o.reshape(bs, self.num_heads * self.head_dim)
