"""Qwen2: the Llama decoder with a bias on the q/k/v projections."""

from radixlm.srt.models.llama import DecoderOptions, LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    options = DecoderOptions(qkv_bias=True)
