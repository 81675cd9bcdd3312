"""A Llama model's decoder layers as one C++ call per forward on CPU (``radixlm_cpu::decoder_layers``).

``DecoderLayer.forward`` makes ~9 kernel calls a layer through Python (norm, QKV, RoPE, paged
attention, O, norm, gate-up, SiLU-and-mul, down), each with module and view wrappers around it: at
one user's decode of the demo model (30 layers) that Python was ~2.4 ms of an ~8 ms step
(docs/benchmarks.md). ``CpuDecoderStack`` hands the same kernels the same arguments from C++
(``kernels/decoder/cpu/decoder_layers.cpp``), so a forward's hidden states are bitwise those of the
module-by-module path (tests/engine/test_decoder_stack.py); the modules stay the reference and run
whatever the stack does not cover.

It covers: tensor parallel size 1; Llama layers without biases or q/k norms; the C++ elementwise and
attention backends; linears whose GEMM backend reports a ``fused_kind`` for the batch's rows (the
packed C++ GEMM, dense ``F.linear``, the quantized rows kernel) and gate-ups fused with their
SiLU-and-mul (``FUSED_SWIGLU``). Anything else runs the modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from radixlm.kernels.attention.cpu_backend import CpuAttnBackend
from radixlm.kernels.elementwise.cpu import CpuElementwise
from radixlm.kernels.gemm.base import FUSED_SWIGLU

if TYPE_CHECKING:
    from radixlm.srt.forward_batch import ForwardBatch
    from radixlm.srt.models.llama import LlamaForCausalLM


class CpuDecoderStack:
    """Runs ``model.layers`` in one ``radixlm_cpu::decoder_layers`` call.

    Build with ``maybe_create`` (None where the model or its backends are not covered); per forward,
    ``kinds(rows, fb)`` says whether this batch is covered and ``forward`` runs it.
    """

    _MEMO_LIMIT = 512  # rows values remembered by kinds()

    def __init__(self, model: "LlamaForCausalLM", attn_backend: CpuAttnBackend):
        layers = model.layers
        attn0 = layers[0].self_attn
        self.model_dtype = layers[0].input_layernorm.weight.dtype
        self.attn_backend = attn_backend
        self.num_heads, self.num_kv_heads, self.head_dim = attn0.num_heads, attn0.num_kv_heads, attn0.head_dim
        self.eps = layers[0].input_layernorm.eps
        self.rotary = model.rotary_emb
        self.norm_weights = [w for layer in layers
                             for w in (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)]
        self.linears = [lin for layer in layers for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                            layer.mlp.gate_up_proj, layer.mlp.down_proj)]
        self.weights = [lin.weight for lin in self.linears]
        self.in_features = [int(getattr(lin.gemm, "in_features", 0)) for lin in self.linears]  # quantized: K
        self._op = torch.ops.radixlm_cpu.decoder_layers
        self._kinds: dict[int, Optional[list[int]]] = {}
        self.forwards = 0  # forwards run through the op (the rest ran the modules)

    @classmethod
    def maybe_create(cls, model, attn_backend) -> Optional["CpuDecoderStack"]:
        """The stack for ``model`` (weights loaded and prepared, backends assigned), or None where it
        does not apply: not a plain Llama decoder, tensor parallel, a bias or q/k norm, a non-CPU
        device, or elementwise / attention backends other than the C++ ones."""
        from radixlm.srt.models.llama import DecoderOptions

        if (getattr(model, "options", None) != DecoderOptions() or model.tp.size != 1
                or not isinstance(attn_backend, CpuAttnBackend) or not len(model.layers)):
            return None
        if not isinstance(model.rotary_emb.elementwise, CpuElementwise):
            return None
        for layer in model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            modules = (layer.input_layernorm, layer.post_attention_layernorm, mlp)
            if any(not isinstance(m.elementwise, CpuElementwise) for m in modules):
                return None
            linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
            if any(lin.bias is not None or lin.weight.device.type != "cpu" for lin in linears):
                return None
            if attn.q_norm is not None or attn.rotary is not model.rotary_emb:
                return None
        return cls(model, attn_backend)

    def kinds(self, rows: int, fb: "ForwardBatch") -> Optional[list[int]]:
        """Each linear's kind for a batch of ``rows`` tokens, or None where the modules must run it."""
        if fb.attn_backend is not self.attn_backend:
            return None
        kinds = self._kinds.get(rows, False)
        if kinds is False:
            found = [FUSED_SWIGLU if getattr(lin, "fused_swiglu", False)
                     else lin.gemm.fused_kind(lin.weight, rows, self.model_dtype) for lin in self.linears]
            kinds = None if any(k is None for k in found) else found
            if len(self._kinds) >= self._MEMO_LIMIT:
                self._kinds.clear()
            self._kinds[rows] = kinds
        return kinds

    def forward(self, positions: torch.Tensor, h: torch.Tensor, kinds: list[int],
                fb: "ForwardBatch") -> torch.Tensor:
        """Runs every layer on the residual stream h (T, hidden), updated in place; returns the last
        layer's MLP output (T, hidden), as the module loop leaves them (``LlamaForCausalLM.forward``)."""
        cos, sin = self.rotary.cos_sin(positions, h.dtype)
        pool = fb.kv_pool
        self.forwards += 1
        return self._op(h, cos, sin, self.norm_weights, self.eps, self.weights, kinds, self.in_features,
                        self.num_heads, self.num_kv_heads, self.head_dim, pool.k_buffers, pool.v_buffers,
                        fb.out_cache_loc, fb.req_to_token_pool.req_to_token, fb.req_pool_indices,
                        *fb.attn_metadata, self.attn_backend.scaling)
