"""Pure-PyTorch paged attention: the CPU backend and the test oracle.

Computes what SGLang's ``torch_native_backend.py`` computes (K/V stored at ``out_cache_loc``, then
each request attends over the slots ``req_to_token[row, :seq_len]``) with batched
matmul-softmax-matmul instead of a per-request loop:

- The KV pool is head-major (``KVPool`` layout ``"HND"``: (KVH, slots, D)), so one ``index_select``
  over a block's slots yields (KVH, R, S, D) — per head and request a contiguous (S, D) matrix that
  feeds ``matmul`` without a further copy.
- Requests are packed into *blocks* of R requests padded to E query rows and S keys each. Padded keys
  are masked to -inf and contribute exact zeros; padded query rows repeat a real row and are dropped.
  ``init_forward_metadata`` builds the blocks once per forward (requests sorted by length, a block
  closed when padding would exceed ~50 % of its real work), so a layer costs a few ops per block, not
  per request. Decode is the E = 1 case.
- GQA: query heads are grouped per KV head, (KVH, R, E * G, D) against (KVH, R, S, D).

Measured on 2 CPU cores, ``scaled_dot_product_attention`` was no faster at these head sizes and much
slower with an explicit mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from radixlm.kernels.attention.base import AttentionBackend

if TYPE_CHECKING:
    from radixlm.srt.forward_batch import ForwardBatch

# A block is closed when its padded work (R * E * S) would exceed this factor of its real work
# (sum of extend_len * seq_len) and the slack it tolerates for tiny blocks (elements of one head).
PAD_FACTOR = 1.5
PAD_SLACK = 1 << 16


@dataclass
class AttnBlock:
    """R requests padded to E query rows and S key slots.

    req_ids: the batch indices of the block's R requests, in block order.
    q_index: (R * E,) int64 rows of the batch's flat queries (a padded row repeats its request's last
        row), or None when the block is the whole batch in order with no padded rows.
    out_rows: (n,) int64 flat batch rows that the block's valid query rows are written to, and
    valid: (n,) int64 their positions among the R * E padded rows (None with q_index None).
    slots: (R * S,) int64 KV slots (padding: slot 0, the dummy page).
    masked: (R, E, 1, S) bool, True where query i of request r may not see key j (j > prefix + i).
    """

    req_ids: list[int]
    num_reqs: int
    num_rows: int
    num_keys: int
    q_index: Optional[torch.Tensor]
    out_rows: Optional[torch.Tensor]
    valid: Optional[torch.Tensor]
    slots: torch.Tensor
    masked: torch.Tensor


def plan_blocks(prefix_lens: list[int], extend_lens: list[int]) -> list[list[int]]:
    """Partition requests into blocks of similar shape. Returns lists of request indices.

    Requests are sorted by (seq_len, extend_len); a request joins the open block unless that would
    make the block's padded work exceed ``PAD_FACTOR`` × its real work plus ``PAD_SLACK``.
    """
    seqs = [p + e for p, e in zip(prefix_lens, extend_lens)]
    n = len(seqs)
    if n and n * max(extend_lens) * max(seqs) <= PAD_FACTOR * sum(e * s for e, s in zip(extend_lens, seqs)) + PAD_SLACK:
        return [list(range(n))]  # the whole batch is one block (the usual decode step)
    order = sorted(range(len(extend_lens)), key=lambda i: (prefix_lens[i] + extend_lens[i], extend_lens[i]))
    blocks: list[list[int]] = []
    cur: list[int] = []
    max_e = max_s = real = 0
    for i in order:
        e, s = extend_lens[i], prefix_lens[i] + extend_lens[i]
        ne, ns, nreal = max(max_e, e), max(max_s, s), real + e * s
        if cur and (len(cur) + 1) * ne * ns > PAD_FACTOR * nreal + PAD_SLACK:
            blocks.append(cur)
            cur, ne, ns, nreal = [], e, s, e * s
        cur.append(i)
        max_e, max_s, real = ne, ns, nreal
    if cur:
        blocks.append(cur)
    return blocks


class TorchNativeAttnBackend(AttentionBackend):
    """Paged attention in plain torch ops over an HND KV pool; GQA by grouping query heads.

    Args:
        num_heads, num_kv_heads, head_dim: of this rank's attention layers.
        scaling: softmax scale (usually head_dim ** -0.5).
    """

    kv_layout = "HND"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scaling: float):
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.group = num_heads // num_kv_heads
        self.head_dim = head_dim
        self.scaling = scaling

    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        fb = forward_batch
        starts = [0]
        for e in fb.extend_lens:
            starts.append(starts[-1] + e)
        blocks = plan_blocks(fb.prefix_lens, fb.extend_lens)
        if len(blocks) == 1 and len(set(fb.extend_lens)) == 1:  # the batch as it is: no gather of q
            fb.attn_metadata = [self._block(fb, list(range(fb.batch_size)), starts, whole=True)]
        else:
            fb.attn_metadata = [self._block(fb, idx, starts, whole=False) for idx in blocks]

    def _block(self, fb: "ForwardBatch", idx: list[int], starts: list[int], whole: bool) -> AttnBlock:
        dev = fb.req_pool_indices.device
        table = fb.req_to_token_pool.req_to_token
        ext = [fb.extend_lens[i] for i in idx]
        pre = [fb.prefix_lens[i] for i in idx]
        r, e, s = len(idx), max(ext), max(p + x for p, x in zip(pre, ext))

        def t(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=dev)

        ext_t, pre_t = t(ext), t(pre)
        ar_e, ar_s = torch.arange(e, device=dev), torch.arange(s, device=dev)
        rows = fb.req_pool_indices if whole else fb.req_pool_indices.index_select(0, t(idx))
        slots = table.index_select(0, rows)[:, :s]
        slots = slots.masked_fill(ar_s[None, :] >= (pre_t + ext_t)[:, None], 0).reshape(-1)
        masked = (ar_s[None, None, :] > (pre_t[:, None] + ar_e[None, :])[:, :, None]).unsqueeze(2)
        if whole:
            return AttnBlock(idx, r, e, s, None, None, None, slots, masked)
        q_index = t([starts[i] for i in idx])[:, None] + torch.minimum(ar_e[None, :], ext_t[:, None] - 1)
        valid = (ar_e[None, :] < ext_t[:, None]).reshape(-1).nonzero().squeeze(1)
        return AttnBlock(idx, r, e, s, q_index.reshape(-1), q_index.reshape(-1).index_select(0, valid), valid,
                         slots, masked)

    def _store(self, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: "ForwardBatch") -> None:
        fb.kv_pool.set_kv(layer_id, fb.out_cache_loc,
                          k.view(-1, self.num_kv_heads, self.head_dim),
                          v.view(-1, self.num_kv_heads, self.head_dim))

    def forward_extend(self, q, k, v, layer_id, forward_batch):
        return self._attend(q, k, v, layer_id, forward_batch)

    def forward_decode(self, q, k, v, layer_id, forward_batch):
        return self._attend(q, k, v, layer_id, forward_batch)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                fb: "ForwardBatch") -> torch.Tensor:
        self._store(k, v, layer_id, fb)
        k_buf, v_buf = fb.kv_pool.get_kv(layer_id)  # (KVH, slots, D)
        kvh, g, d = self.num_kv_heads, self.group, self.head_dim
        qv = q.view(-1, kvh, g, d)
        out = None
        for b in fb.attn_metadata:
            qb = qv if b.q_index is None else qv.index_select(0, b.q_index)
            # (R*E, KVH, G, D) -> (KVH, R, E*G, D)
            qb = qb.view(b.num_reqs, b.num_rows, kvh, g, d).permute(2, 0, 1, 3, 4).reshape(kvh, b.num_reqs, -1, d)
            kb = k_buf.index_select(1, b.slots).view(kvh, b.num_reqs, b.num_keys, d)
            vb = v_buf.index_select(1, b.slots).view(kvh, b.num_reqs, b.num_keys, d)
            scores = torch.matmul(qb, kb.transpose(-1, -2)).mul_(self.scaling)  # (KVH, R, E*G, S)
            scores = scores.view(kvh, b.num_reqs, b.num_rows, g, b.num_keys).masked_fill_(b.masked, float("-inf"))
            probs = scores.softmax(dim=-1).view(kvh, b.num_reqs, -1, b.num_keys)
            o = torch.matmul(probs, vb).view(kvh, b.num_reqs * b.num_rows, g, d).permute(1, 0, 2, 3)
            if b.q_index is None:
                return o.reshape(q.shape[0], -1)
            if out is None:
                out = q.new_empty(q.shape[0], kvh, g, d)
            out.index_copy_(0, b.out_rows, o.index_select(0, b.valid))
        return out.view(q.shape[0], -1)
