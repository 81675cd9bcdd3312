"""Greedy reference outputs from Hugging Face transformers (fp32, CPU), one prompt at a time."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=8)
def _hf_model(path: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model


def hf_greedy(path: str, prompts_ids: tuple[tuple[int, ...], ...], max_new_tokens: int,
              repetition_penalty: float = 1.0) -> list[list[int]]:
    """Greedy continuation ids of each prompt (no EOS stop: ``min_new_tokens`` keeps going), with
    HF's repetition penalty where given."""
    return [list(x) for x in _hf_greedy_cached(path, prompts_ids, max_new_tokens, repetition_penalty)]


@functools.lru_cache(maxsize=64)
def _hf_greedy_cached(path: str, prompts_ids: tuple[tuple[int, ...], ...], max_new_tokens: int,
                      repetition_penalty: float = 1.0):
    model = _hf_model(path)
    outs = []
    with torch.no_grad():
        for ids in prompts_ids:
            x = torch.tensor([ids])
            g = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                               min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0,
                               repetition_penalty=repetition_penalty)
            outs.append(tuple(g[0, len(ids):].tolist()))
    return tuple(outs)


def hf_logits(path: str, ids: list[int]) -> torch.Tensor:
    """Full-sequence logits (len(ids), vocab) of the HF model."""
    with torch.no_grad():
        return _hf_model(path)(torch.tensor([ids])).logits[0]
