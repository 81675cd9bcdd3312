"""FlashInfer paged attention for CUDA (SGLang's ``layers/attention/flashinfer_backend.py`` shape).

Targets ``flashinfer-python`` 0.7.2.post1 (the JIT build; ``scripts/fetch_gpu_wheels.sh`` pins it) and
only uses API that has been stable since 0.2: ``BatchPrefillWithRaggedKVCacheWrapper``,
``BatchPrefillWithPagedKVCacheWrapper``, ``BatchDecodeWithPagedKVCacheWrapper`` (``plan()`` once per
batch with ``sm_scale``/``q_data_type``/``kv_data_type``, ``run()`` once per layer) and
``flashinfer.merge_state``. flashinfer is imported only when the backend is constructed, so this
module imports on a CPU-only machine; the planning helpers below are pure torch and run on CPU.

Layout (as SGLang): wrappers are planned with **page size 1 over KV slots**. ``kv_indices`` are the
slots ``req_to_token[row, :len]`` (``int32``), ``kv_last_page_len`` is all ones, and the pool's
per-layer buffers ``(slots, kv_heads, head_dim)`` are passed as NHD caches ``(slots, 1, kv_heads,
head_dim)``. The server's ``--page-size`` then only shapes allocation; any page size works.

Extend: new tokens' K/V are written at ``out_cache_loc`` first, then
  * no request has a cached prefix: one ragged causal pass over the new q/k/v;
  * otherwise: ragged causal over the new tokens (o1, lse1) + paged *non-causal* pass of the new
    queries over the cached prefix only (o2, lse2), combined with ``merge_state``.
Ragged + merge is the default (SGLang's choice): new K/V are read from the contiguous q/k/v tensors
instead of gathered back from scattered slots, and a prefix-free prefill needs no paged pass at
all. ``use_ragged=False`` instead runs one paged causal pass over prefix + new tokens (simpler, one
kernel; FlashInfer aligns the causal mask bottom-right, so query i sits at position prefix + i).
Decode: ``BatchDecodeWithPagedKVCacheWrapper`` over all of a request's slots. GQA is native to all
three kernels (``num_qo_heads`` a multiple of ``num_kv_heads``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

import torch

from radixlm.kernels.attention.base import AttentionBackend

if TYPE_CHECKING:
    from radixlm.srt.forward_batch import ForwardBatch

# FlashInfer's documented default float workspace (split-k partial outputs); shared by all wrappers.
DEFAULT_WORKSPACE_BYTES = 128 * 1024 * 1024
# Head sizes FlashInfer's FA2 kernels are built and tested for; stories260K's head_dim 8 is not one.
SUPPORTED_HEAD_DIMS = (64, 128, 256)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)

Lens = Union[Sequence[int], torch.Tensor]


def flashinfer_supports(head_dim: int, dtype: Optional[torch.dtype] = None) -> bool:
    """Whether this backend can serve a model with ``head_dim`` (and ``dtype`` if given).
    ``--attention-backend auto`` should fall back to torch_native when this is False."""
    return head_dim in SUPPORTED_HEAD_DIMS and (dtype is None or dtype in SUPPORTED_DTYPES)


# ---- planning: pure functions on CPU (or device) tensors --------------------------------------
def build_qo_indptr(extend_lens: Lens) -> torch.Tensor:
    """``[0, cumsum(extend_lens)]`` as a CPU ``int32`` tensor of shape (bs + 1,): request i's new
    tokens are rows ``qo_indptr[i]:qo_indptr[i+1]`` of the flat q/k/v (and of the ragged K/V)."""
    lens = torch.as_tensor(extend_lens, dtype=torch.int64, device="cpu")
    indptr = torch.zeros(lens.numel() + 1, dtype=torch.int64)
    torch.cumsum(lens, 0, out=indptr[1:])
    return indptr.to(torch.int32)


def build_kv_indices(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                     seq_lens: Lens) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten the first ``seq_lens[i]`` slots of each request's ``req_to_token`` row.

    Args:
        req_to_token: (rows, max_context_len) int64 slot table (CPU or CUDA).
        req_pool_indices: (bs,) integer rows of the batch's requests (any device).
        seq_lens: (bs,) token counts (list or CPU tensor, so no device sync is needed).
    Returns:
        kv_indptr: (bs + 1,) int32 on CPU, ``[0, cumsum(seq_lens)]``.
        kv_indices: (sum(seq_lens),) int32 on ``req_to_token``'s device:
        ``kv_indices[kv_indptr[i]:kv_indptr[i+1]] == req_to_token[req_pool_indices[i], :seq_lens[i]]``.
    """
    kv_indptr = build_qo_indptr(seq_lens)
    total = int(kv_indptr[-1])
    device = req_to_token.device
    bs = kv_indptr.numel() - 1
    lens = torch.as_tensor(seq_lens, dtype=torch.int64, device="cpu").to(device, non_blocking=True)
    starts = kv_indptr[:-1].to(device=device, dtype=torch.int64, non_blocking=True)
    # Row of each flat position, and its column inside that row; output_size avoids a device sync.
    owner = torch.repeat_interleave(torch.arange(bs, device=device), lens, output_size=total)
    col = torch.arange(total, device=device) - starts[owner]
    rows = req_pool_indices.to(device=device, dtype=torch.int64)[owner]
    return kv_indptr, req_to_token[rows, col].to(torch.int32)


@dataclass(frozen=True)
class ExtendPlan:
    """Plan arguments of one extend batch (bs requests, T new tokens, P cached prefix tokens).

    qo_indptr: (bs + 1,) int32 CPU; also the ragged pass's kv_indptr (new K/V are the new rows).
    prefix_kv_indptr: (bs + 1,) int32 CPU, ``[0, cumsum(prefix_lens)]``.
    prefix_kv_indices: (P,) int32 slots of the cached prefixes, on the slot table's device.
    has_prefix: whether any request has a cached prefix (else no paged pass is needed).
    """

    qo_indptr: torch.Tensor
    prefix_kv_indptr: torch.Tensor
    prefix_kv_indices: torch.Tensor
    has_prefix: bool


def build_prefix_kv(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: Lens,
                    extend_lens: Lens) -> ExtendPlan:
    """Split an extend batch into the ragged part (new tokens) and the paged part (cached prefix).
    Shapes and devices: see ``ExtendPlan``; requests without a prefix get an empty KV range."""
    indptr, indices = build_kv_indices(req_to_token, req_pool_indices, prefix_lens)
    return ExtendPlan(build_qo_indptr(extend_lens), indptr, indices, bool(int(indptr[-1]) > 0))


def kv_last_page_len(batch_size: int, device: Union[str, torch.device] = "cpu") -> torch.Tensor:
    """(bs,) int32 ones: with page size 1 every "page" (slot) is full."""
    return torch.ones(batch_size, dtype=torch.int32, device=device)


def pad_decode_kv(kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                  num_padding: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Append ``num_padding`` rows of one key each, at slot 0 (the dummy page), to a decode plan;
    used when a batch is padded up to a captured CUDA-graph size. Devices are kept."""
    if num_padding == 0:
        return kv_indptr, kv_indices
    extra = torch.arange(1, num_padding + 1, dtype=kv_indptr.dtype, device=kv_indptr.device)
    pad = torch.zeros(num_padding, dtype=kv_indices.dtype, device=kv_indices.device)
    return torch.cat([kv_indptr, kv_indptr[-1] + extra]), torch.cat([kv_indices, pad])


# ---- the backend --------------------------------------------------------------------------
@dataclass
class DecodeMetadata:
    wrapper: Any  # a planned BatchDecodeWithPagedKVCacheWrapper


@dataclass
class ExtendMetadata:
    ragged: Any  # planned ragged wrapper (causal over new tokens), or None when use_ragged is off
    paged: Any  # planned paged wrapper (prefix-only non-causal, or full causal), or None
    has_prefix: bool


class FlashInferAttnBackend(AttentionBackend):
    """Paged prefill/decode with FlashInfer's batch wrappers; see the module docstring.

    Args:
        num_heads, num_kv_heads, head_dim: of this rank's attention layers (GQA when they differ).
        scaling: softmax scale (usually head_dim ** -0.5).
        workspace_bytes: float workspace shared by all wrappers (allocated on first use).
        use_ragged: extend as ragged + merged prefix (default) or as one paged causal pass.
        decode_use_tensor_cores: decode through the prefill (tensor-core) kernel; default follows
            SGLang: on for GQA groups of 4 or more.
        kernel_backend: FlashInfer ``backend=`` of all wrappers; "fa2" runs on sm80+ and needs one
            JIT module per (dtype, head_dim) ("auto" would pick and JIT-compile fa3 on Hopper).
    Raises:
        ImportError: flashinfer is not installed (``pip install 'radixlm[cuda]'``).
        ValueError: heads do not divide, or a head_dim FlashInfer does not support.
    The KV dtype must be float16 or bfloat16 (checked at the first plan).
    """

    supports_cuda_graph = True

    name = "flashinfer"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scaling: float, *,
                 workspace_bytes: int = DEFAULT_WORKSPACE_BYTES, use_ragged: bool = True,
                 decode_use_tensor_cores: Optional[bool] = None, kernel_backend: str = "fa2"):
        try:
            import flashinfer
        except ImportError as exc:
            raise ImportError("the flashinfer attention backend needs flashinfer-python "
                              "(pip install 'radixlm[cuda]')") from exc
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
        if not flashinfer_supports(head_dim):
            raise ValueError(f"flashinfer supports head_dim in {SUPPORTED_HEAD_DIMS}, got {head_dim}; "
                             "use --attention-backend torch_native")
        self._fi = flashinfer
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scaling = scaling
        self.use_ragged = use_ragged
        if decode_use_tensor_cores is None:
            decode_use_tensor_cores = num_heads // num_kv_heads >= 4
        self.decode_use_tensor_cores = decode_use_tensor_cores
        self.kernel_backend = kernel_backend
        self.workspace_bytes = workspace_bytes
        self._workspace: Optional[torch.Tensor] = None
        self._ragged = self._paged = self._decode = None
        self._cg: dict[str, torch.Tensor] = {}
        self._cg_wrappers: dict[int, Any] = {}

    # -- wrappers ------------------------------------------------------------------------------
    def _ensure_wrappers(self, device: torch.device) -> None:
        if self._workspace is not None:
            return
        fi, be = self._fi, self.kernel_backend
        # FlashInfer requires the workspace zeroed before its first use.
        self._workspace = torch.zeros(self.workspace_bytes, dtype=torch.uint8, device=device)
        self._ragged = fi.BatchPrefillWithRaggedKVCacheWrapper(self._workspace, "NHD", backend=be)
        self._paged = fi.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD", backend=be)
        self._decode = fi.BatchDecodeWithPagedKVCacheWrapper(
            self._workspace, "NHD", use_tensor_cores=self.decode_use_tensor_cores, backend=be)

    def _dtype(self, fb: "ForwardBatch") -> torch.dtype:
        dtype = fb.kv_pool.k_buffers[0].dtype
        if dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"flashinfer needs a float16/bfloat16 KV cache, got {dtype}; "
                             "use --dtype bfloat16 or --attention-backend torch_native")
        return dtype

    def _kv_cache(self, layer_id: int, fb: "ForwardBatch") -> tuple[torch.Tensor, torch.Tensor]:
        k, v = fb.kv_pool.get_kv(layer_id)  # (slots, KVH, D) -> NHD pages of one slot
        return k.unsqueeze(1), v.unsqueeze(1)

    def _plan_decode(self, wrapper: Any, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                     dtype: torch.dtype) -> None:
        bs = kv_indptr.numel() - 1
        wrapper.plan(kv_indptr, kv_indices, kv_last_page_len(bs), self.num_heads, self.num_kv_heads,
                     self.head_dim, 1, q_data_type=dtype, kv_data_type=dtype, sm_scale=self.scaling)

    # -- planning ------------------------------------------------------------------------------
    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        from radixlm.srt.forward_batch import ForwardMode

        fb = forward_batch
        dtype = self._dtype(fb)
        table = fb.req_to_token_pool.req_to_token
        self._ensure_wrappers(table.device)
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        common = dict(q_data_type=dtype, kv_data_type=dtype, sm_scale=self.scaling)
        if fb.forward_mode is ForwardMode.DECODE:
            kv_indptr, kv_indices = build_kv_indices(table, fb.req_pool_indices, fb.seq_lens)
            self._plan_decode(self._decode, kv_indptr, kv_indices, dtype)
            fb.attn_metadata = DecodeMetadata(self._decode)
            return
        ones = kv_last_page_len(fb.batch_size)
        if not self.use_ragged:
            qo_indptr = build_qo_indptr(fb.extend_lens)
            kv_indptr, kv_indices = build_kv_indices(table, fb.req_pool_indices, fb.seq_lens)
            self._paged.plan(qo_indptr, kv_indptr, kv_indices, ones, h, kvh, d, 1, causal=True, **common)
            fb.attn_metadata = ExtendMetadata(None, self._paged, True)
            return
        plan = build_prefix_kv(table, fb.req_pool_indices, fb.prefix_lens, fb.extend_lens)
        self._ragged.plan(plan.qo_indptr, plan.qo_indptr, h, kvh, d, causal=True, **common)
        if plan.has_prefix:
            self._paged.plan(plan.qo_indptr, plan.prefix_kv_indptr, plan.prefix_kv_indices, ones,
                             h, kvh, d, 1, causal=False, **common)
        fb.attn_metadata = ExtendMetadata(self._ragged, self._paged if plan.has_prefix else None,
                                          plan.has_prefix)

    # -- CUDA graphs (decode only; see radixlm.srt.cuda_graph_runner) ----------------------------
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, device: torch.device) -> None:
        """Static plan buffers shared by every captured batch size: kv_indptr (max_bs + 1,),
        kv_indices (max_num_tokens + max_bs,) (every slot once, plus one dummy key per padded
        row) and kv_last_page_len (max_bs,) ones, all int32 on ``device``."""
        self._ensure_wrappers(device)
        self._cg = {
            "indptr": torch.zeros(max_bs + 1, dtype=torch.int32, device=device),
            "indices": torch.zeros(max_num_tokens + max_bs, dtype=torch.int32, device=device),
            "last_page_len": kv_last_page_len(max_bs, device),
        }
        self._cg_wrappers = {}

    def init_forward_metadata_cuda_graph(self, forward_batch: "ForwardBatch", num_real: int) -> None:
        """Plan the graph wrapper of ``fb.batch_size`` (the captured size; created on first use,
        i.e. at capture). Rows ``[0, num_real)`` are the real requests (``fb.req_pool_indices`` and
        ``fb.seq_lens``); the remaining rows are padding attending to one key at slot 0. Call
        outside graph capture: planning copies host data into the static buffers."""
        fb = forward_batch
        bs = fb.batch_size
        wrapper = self._cg_wrappers.get(bs)
        if wrapper is None:
            wrapper = self._fi.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace, "NHD", use_cuda_graph=True, use_tensor_cores=self.decode_use_tensor_cores,
                paged_kv_indptr_buffer=self._cg["indptr"][:bs + 1],
                paged_kv_indices_buffer=self._cg["indices"],
                paged_kv_last_page_len_buffer=self._cg["last_page_len"][:bs], backend=self.kernel_backend)
            self._cg_wrappers[bs] = wrapper
        table = fb.req_to_token_pool.req_to_token
        kv_indptr, kv_indices = build_kv_indices(table, fb.req_pool_indices[:num_real], fb.seq_lens[:num_real])
        kv_indptr, kv_indices = pad_decode_kv(kv_indptr, kv_indices, bs - num_real)
        self._plan_decode(wrapper, kv_indptr, kv_indices, self._dtype(fb))
        fb.attn_metadata = DecodeMetadata(wrapper)

    # -- attention -----------------------------------------------------------------------------
    def _store(self, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: "ForwardBatch") -> None:
        fb.kv_pool.set_kv(layer_id, fb.out_cache_loc, k.view(-1, self.num_kv_heads, self.head_dim),
                          v.view(-1, self.num_kv_heads, self.head_dim))

    def forward_extend(self, q, k, v, layer_id, forward_batch):
        fb = forward_batch
        meta: ExtendMetadata = fb.attn_metadata
        self._store(k, v, layer_id, fb)
        q3 = q.view(-1, self.num_heads, self.head_dim)
        if meta.ragged is None:  # one paged causal pass over prefix + new tokens
            o = meta.paged.run(q3, self._kv_cache(layer_id, fb))
        else:
            k3 = k.view(-1, self.num_kv_heads, self.head_dim)
            v3 = v.view(-1, self.num_kv_heads, self.head_dim)
            if not meta.has_prefix:
                o = meta.ragged.run(q3, k3, v3)
            else:
                o1, s1 = meta.ragged.run(q3, k3, v3, return_lse=True)
                o2, s2 = meta.paged.run(q3, self._kv_cache(layer_id, fb), return_lse=True)
                o, _ = self._fi.merge_state(o1, s1, o2, s2)
        return o.view(-1, self.num_heads * self.head_dim)

    def forward_decode(self, q, k, v, layer_id, forward_batch):
        fb = forward_batch
        self._store(k, v, layer_id, fb)
        q3 = q.view(-1, self.num_heads, self.head_dim)
        o = fb.attn_metadata.wrapper.run(q3, self._kv_cache(layer_id, fb))
        return o.view(-1, self.num_heads * self.head_dim)
