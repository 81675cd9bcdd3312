"""Qwen3: the Llama decoder with per-head RMSNorm on queries and keys before RoPE."""

from radixlm.srt.models.llama import DecoderOptions, LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    options = DecoderOptions(qk_norm=True)
