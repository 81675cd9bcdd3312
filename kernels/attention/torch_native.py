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
- Shared prefixes (cascade attention, as FlashInfer's ``MultiLevelCascadeAttentionWrapper`` and
  Hydragen, Juravsky et al. 2024): requests whose ``req_to_token`` rows start with the same
  ``CASCADE_MIN_PREFIX``+ slots — radix-cache hits on one prefix — form a block whose queries attend
  to that prefix together, as one (KVH, R * E * G, D) x (KVH, D, P) matmul over K/V gathered once,
  and to their own suffixes as above; the two parts share one softmax (a common max, summed
  normalisers), so the result is the same attention up to fp32 rounding.

Measured on 2 CPU cores, ``scaled_dot_product_attention`` was no faster at these head sizes and much
slower with an explicit mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from radixlm.kernels.attention.base import AttentionBackend
from radixlm.kernels.attention.cascade import shared_prefix_groups

if TYPE_CHECKING:
    from radixlm.srt.forward_batch import ForwardBatch

# A block is closed when its padded work (R * E * S) would exceed this factor of its real work
# (sum of extend_len * seq_len) and the slack it tolerates for tiny blocks (elements of one head).
PAD_FACTOR = 1.5
PAD_SLACK = 1 << 16
# Shortest shared prefix (tokens) worth a cascade block.
CASCADE_MIN_PREFIX = 32


@dataclass
class AttnBlock:
    """R requests padded to E query rows and S key slots.

    req_ids: the batch indices of the block's R requests, in block order.
    q_index: (R * E,) int64 rows of the batch's flat queries (a padded row repeats its request's last
        row), or None when the block is the whole batch in order with no padded rows.
    out_rows: (n,) int64 flat batch rows that the block's valid query rows are written to, and
    valid: (n,) int64 their positions among the R * E padded rows (None with q_index None).
    slots: (R * S,) int64 KV slots after the shared prefix (padding: slot 0, the dummy page).
    masked: (R, E, 1, S) bool, True where query i of request r may not see key P + j
        (P + j > prefix + i).
    prefix_slots: (P,) int64 slots of the prefix every request of the block shares (cascade), or None
        (P = 0).
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
    prefix_slots: Optional[torch.Tensor] = None
    # Gather buffers (KVH, R * S, D) and (KVH, P, D) for K and V, allocated once per forward and
    # reused by every layer (no fresh multi-MB allocation per layer).
    work: Optional[list[torch.Tensor]] = None


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

    name = "torch_native"
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
        blocks = []
        for shared, idx in shared_prefix_groups(fb, CASCADE_MIN_PREFIX):
            sub = plan_blocks([fb.prefix_lens[i] - shared for i in idx], [fb.extend_lens[i] for i in idx])
            blocks += [(shared, sorted(idx[j] for j in b)) for b in sub]
        fb.attn_metadata = [self._block(fb, idx, starts, shared) for shared, idx in blocks]
        k_buf = fb.kv_pool.get_kv(0)[0]
        for b in fb.attn_metadata:
            sizes = [b.slots.numel()] * 2 + ([b.prefix_slots.numel()] * 2 if b.prefix_slots is not None else [])
            b.work = [k_buf.new_empty(self.num_kv_heads, n, self.head_dim) for n in sizes]

    def _block(self, fb: "ForwardBatch", idx: list[int], starts: list[int], shared: int) -> AttnBlock:
        dev = fb.req_pool_indices.device
        table = fb.req_to_token_pool.req_to_token
        ext = [fb.extend_lens[i] for i in idx]
        pre = [fb.prefix_lens[i] - shared for i in idx]  # prefix beyond the shared part
        r, e, s = len(idx), max(ext), max(p + x for p, x in zip(pre, ext))
        whole = idx == list(range(fb.batch_size)) and len(set(ext)) == 1  # the batch as it is: no q gather
        ext_t, pre_t = _tensor(ext, dev), _tensor(pre, dev)
        ar_e, ar_s = torch.arange(e, device=dev), torch.arange(s, device=dev)
        rows = fb.req_pool_indices if whole else fb.req_pool_indices.index_select(0, _tensor(idx, dev))
        slots = table[:, shared:shared + s].index_select(0, rows)  # only the columns in use
        slots = slots.masked_fill(ar_s[None, :] >= (pre_t + ext_t)[:, None], 0).reshape(-1)
        masked = (ar_s[None, None, :] > (pre_t[:, None] + ar_e[None, :])[:, :, None]).unsqueeze(2)
        prefix_slots = table[rows[0], :shared].clone() if shared else None
        if whole:
            return AttnBlock(idx, r, e, s, None, None, None, slots, masked, prefix_slots)
        q_index = _tensor([starts[i] for i in idx], dev)[:, None] + torch.minimum(ar_e[None, :], ext_t[:, None] - 1)
        valid = (ar_e[None, :] < ext_t[:, None]).reshape(-1).nonzero().squeeze(1)
        return AttnBlock(idx, r, e, s, q_index.reshape(-1), q_index.reshape(-1).index_select(0, valid), valid,
                         slots, masked, prefix_slots)

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
            kb = torch.index_select(k_buf, 1, b.slots, out=b.work[0]).view(kvh, b.num_reqs, b.num_keys, d)
            vb = torch.index_select(v_buf, 1, b.slots, out=b.work[1]).view(kvh, b.num_reqs, b.num_keys, d)
            scores = torch.matmul(qb, kb.transpose(-1, -2)).mul_(self.scaling)  # (KVH, R, E*G, S)
            scores = scores.view(kvh, b.num_reqs, b.num_rows, g, b.num_keys).masked_fill_(b.masked, float("-inf"))
            if b.prefix_slots is None:
                probs = scores.softmax(dim=-1).view(kvh, b.num_reqs, -1, b.num_keys)
                o = torch.matmul(probs, vb)
            else:
                kp = torch.index_select(k_buf, 1, b.prefix_slots, out=b.work[2])  # (KVH, P, D), once per block
                vp = torch.index_select(v_buf, 1, b.prefix_slots, out=b.work[3])
                o = self._cascade(qb, scores.view(kvh, b.num_reqs, -1, b.num_keys), vb, kp, vp)
            o = o.view(kvh, b.num_reqs * b.num_rows, g, d).permute(1, 0, 2, 3)
            if b.q_index is None:
                return o.reshape(q.shape[0], -1)
            if out is None:
                out = q.new_empty(q.shape[0], kvh, g, d)
            out.index_copy_(0, b.out_rows, o.index_select(0, b.valid))
        return out.view(q.shape[0], -1)

    def _cascade(self, qb: torch.Tensor, suffix_scores: torch.Tensor, vb: torch.Tensor, kp: torch.Tensor,
                 vp: torch.Tensor) -> torch.Tensor:
        """Attention over [shared prefix, own suffix] with one softmax. qb (KVH, R, E*G, D);
        suffix_scores (KVH, R, E*G, S) scaled and masked; vb (KVH, R, S, D); kp, vp (KVH, P, D) the
        shared prefix's K/V. Returns (KVH, R, E*G, D)."""
        kvh, r, rows, d = qb.shape
        prefix_scores = torch.matmul(qb.reshape(kvh, r * rows, d), kp.transpose(-1, -2)).mul_(self.scaling)
        suffix_scores = suffix_scores.reshape(kvh, r * rows, -1)
        m = torch.maximum(prefix_scores.amax(-1, keepdim=True), suffix_scores.amax(-1, keepdim=True))
        ep = prefix_scores.sub_(m).exp_()
        es = suffix_scores.sub_(m).exp_()
        z = ep.sum(-1, keepdim=True).add_(es.sum(-1, keepdim=True))
        o = torch.matmul(ep, vp).add_(torch.matmul(es.view(kvh, r, rows, -1), vb).view(kvh, r * rows, d))
        return o.div_(z).view(kvh, r, rows, d)


def _tensor(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)
