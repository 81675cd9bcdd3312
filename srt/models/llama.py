"""Llama-family decoder (Llama 2/3, SmolLM2, TinyStories) with paged attention from ``kernels/``.

Follows HF ``modeling_llama.py`` numerically (fp32 RMSNorm, rotate-half RoPE) with SGLang's stacked
``qkv_proj``/``gate_up_proj`` weights and Megatron tensor parallelism. Qwen2 (qkv bias) and Qwen3
(per-head q/k RMSNorm) reuse this code through ``DecoderOptions``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Optional

import torch
from torch import nn

from radixlm.kernels.elementwise.base import ElementwiseBackend

from radixlm.srt.layers.linear import (MergedColumnParallelLinear, ParallelLMHead, QKVParallelLinear,
                                       RowParallelLinear, VocabParallelEmbedding)
from radixlm.srt.layers.norm_rope import REFERENCE_ELEMENTWISE, RMSNorm, RotaryEmbedding
from radixlm.srt.layers.parallel_state import TpGroup

if TYPE_CHECKING:
    from radixlm.srt.forward_batch import ForwardBatch
    from radixlm.srt.models.decoder_stack import CpuDecoderStack


@dataclass(frozen=True)
class DecoderOptions:
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False  # Qwen3


class Attention(nn.Module):
    def __init__(self, cfg, layer_id: int, tp: TpGroup, opts: DecoderOptions, dtype: torch.dtype,
                 rotary: RotaryEmbedding):
        super().__init__()
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        bias = opts.qkv_bias or bool(getattr(cfg, "attention_bias", False))
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, head_dim, cfg.num_attention_heads,
                                          cfg.num_key_value_heads, bias, tp, dtype)
        self.o_proj = RowParallelLinear(cfg.num_attention_heads * head_dim, cfg.hidden_size,
                                        bool(getattr(cfg, "attention_bias", False)) and not opts.qkv_bias, tp, dtype)
        self.rotary = rotary  # shared by all layers
        self.q_norm = RMSNorm(head_dim, cfg.rms_norm_eps, dtype) if opts.qk_norm else None
        self.k_norm = RMSNorm(head_dim, cfg.rms_norm_eps, dtype) if opts.qk_norm else None
        self.layer_id = layer_id
        self.head_dim = head_dim
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads

    def forward(self, positions: torch.Tensor, x: torch.Tensor, fb: "ForwardBatch") -> torch.Tensor:
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.qkv_proj.q_size, self.qkv_proj.kv_size, self.qkv_proj.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        out = fb.attn_backend.forward(q.reshape(q.shape[0], -1), k.reshape(k.shape[0], -1),
                                      v.contiguous(), self.layer_id, fb)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, cfg, tp: TpGroup, dtype: torch.dtype):
        super().__init__()
        inter = cfg.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(cfg.hidden_size, [inter, inter], False, tp, dtype)
        self.down_proj = RowParallelLinear(inter, cfg.hidden_size, False, tp, dtype)
        self.elementwise: ElementwiseBackend = REFERENCE_ELEMENTWISE

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj.silu_and_mul(x, self.elementwise))


class DecoderLayer(nn.Module):
    def __init__(self, cfg, layer_id: int, tp: TpGroup, opts: DecoderOptions, dtype: torch.dtype,
                 rotary: RotaryEmbedding):
        super().__init__()
        self.self_attn = Attention(cfg, layer_id, tp, opts, dtype, rotary)
        self.mlp = MLP(cfg, tp, dtype)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)

    def forward(self, positions: torch.Tensor, h: torch.Tensor, delta: "torch.Tensor | None",
                fb: "ForwardBatch") -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream h (T, hidden) gets the previous layer's MLP output ``delta`` added (in
        place, fused with the first norm); returns (h, this layer's MLP output) for the next layer."""
        a = self.self_attn(positions, self.input_layernorm(h, delta), fb)
        return h, self.mlp(self.post_attention_layernorm(h, a))


class LlamaForCausalLM(nn.Module):
    """forward(input_ids (T,), positions (T,), forward_batch) -> logits (R, vocab) float32 for the
    rows ``forward_batch.logits_indices``."""

    options = DecoderOptions()
    # HF name fragment -> (our parameter name fragment, shard id)
    stacked_params = (
        (".q_proj.", ".qkv_proj.", "q"), (".k_proj.", ".qkv_proj.", "k"), (".v_proj.", ".qkv_proj.", "v"),
        (".gate_proj.", ".gate_up_proj.", "0"), (".up_proj.", ".gate_up_proj.", "1"),
    )

    def __init__(self, cfg, tp: TpGroup, dtype: torch.dtype):
        super().__init__()
        self.config = cfg
        self.tp = tp
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp, dtype)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.rotary_emb = RotaryEmbedding(cfg, head_dim)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, tp, self.options, dtype, self.rotary_emb)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp, dtype)
        self.tie_word_embeddings = bool(getattr(cfg, "tie_word_embeddings", False))
        # the layers as one C++ call on CPU (srt/models/decoder_stack.py), set by the model runner
        self.decoder_stack: Optional["CpuDecoderStack"] = None

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: "ForwardBatch") -> torch.Tensor:
        self.rotary_emb.reset()
        h, delta = self.embed_tokens(input_ids), None
        kinds = self.decoder_stack.kinds(h.shape[0], fb) if self.decoder_stack is not None else None
        if kinds is not None:
            delta = self.decoder_stack.forward(positions, h, kinds, fb)
        else:
            for layer in self.layers:
                h, delta = layer(positions, h, delta, fb)
        rows = fb.logits_indices
        h = self.norm(h[rows], delta[rows])  # the last residual add only for the rows that need logits
        return self.lm_head.logits(h)  # in the model's dtype: ModelRunner.forward widens them to fp32

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named full weights, sharding for this rank. Raises KeyError on an unknown name
        and ValueError when a parameter was never loaded."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("model.")
            if "rotary_emb.inv_freq" in name:
                continue
            shard_id = None
            for frag, ours, sid in self.stacked_params:
                if frag in name:
                    name, shard_id = name.replace(frag, ours), sid
                    break
            if name == "embed_tokens.weight" and self.tie_word_embeddings:
                self._load("lm_head.weight", params, tensor, None, loaded)
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue
            self._load(name, params, tensor, shard_id, loaded)
        missing = sorted(set(params) - loaded)
        if missing:
            raise ValueError(f"weights missing from the checkpoint: {', '.join(missing[:8])}")

    def _load(self, name: str, params: dict, tensor: torch.Tensor, shard_id, loaded: set) -> None:
        if name not in params:
            raise KeyError(f"checkpoint weight {name!r} has no parameter in {type(self).__name__}")
        owner = self.get_submodule(name.rsplit(".", 1)[0])
        param = params[name]
        tensor = tensor.to(param.dtype)
        if hasattr(owner, "weight_loader"):
            owner.weight_loader(param, tensor, shard_id)
        else:
            param.data.copy_(tensor)
        loaded.add(name)
