"""Shared pieces of the GPU tests: test models (stories260K from tests/assets/models, random-weight
Llamas with FlashInfer-sized heads), and a greedy comparison that tolerates near-ties only.

Also a CLI for scripts/gpu_check.sh::

    python -m tests.gpu.helpers make-model --preset smollm2 --out /tmp/smollm2-random
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Optional

import torch

STORIES_HF = Path(__file__).resolve().parents[1] / "assets" / "models" / "stories260k-hf"

# Random-weight Llamas with head_dim 64 (FlashInfer needs 64/128/256). gqa4 decodes through the
# tensor-core kernel, gqa3 (SmolLM2's head layout) through the CUDA-core decode kernel.
PRESETS: dict[str, dict] = {
    "gqa4": dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048),
    "gqa3": dict(hidden_size=576, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=9,
                 num_key_value_heads=3, vocab_size=512, max_position_embeddings=2048),
    # SmolLM2-135M's shapes, random weights: for throughput only (its real weights do not fit the
    # 64 MiB that travels to the GPU machine).
    "smollm2": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192,
                    tie_word_embeddings=True, rope_theta=100000.0),
}


def stories_path() -> Optional[str]:
    """stories260K as an HF folder (tests/assets/models, in the repository), or None if the checkout lacks it."""
    return str(STORIES_HF) if (STORIES_HF / "model.safetensors").exists() else None


def save_random_llama(out: str, preset: str, seed: int = 1234, init_range: float = 0.1) -> str:
    """Write a random-weight LlamaForCausalLM (bf16 safetensors, stories260K's tokenizer) to ``out``."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    fields = dict(PRESETS[preset])
    rope = {"rope_type": "default", "rope_theta": fields.pop("rope_theta", 10000.0)}
    cfg = LlamaConfig(head_dim=64, rms_norm_eps=1e-6, initializer_range=init_range, rope_parameters=rope,
                      tie_word_embeddings=fields.pop("tie_word_embeddings", False), **fields)
    cfg.rope_theta = rope["rope_theta"]  # older transformers read the top-level field
    cfg.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).to(torch.bfloat16)
    Path(out).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    src = stories_path()
    if src is None:
        raise FileNotFoundError("stories260k-hf (for its tokenizer) is missing from tests/assets/models")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, f), os.path.join(out, f))
    return out


def assert_greedy_close(path: str, prompts: list[list[int]], ours: list[list[int]], ref: list[list[int]],
                        tol: float) -> None:
    """``ours`` equals the greedy reference ``ref`` (transformers, fp32), except that at the first
    position where they differ the reference's logits (teacher-forced on the shared prefix) rank
    our token within ``tol`` of its own: a near-tie that the kernels' rounding may flip. Tokens
    after such a divergence are not compared (the contexts differ)."""
    from tests.engine.reference import hf_logits

    for prompt, mine, theirs in zip(prompts, ours, ref):
        assert len(mine) == len(theirs)
        for j, (a, b) in enumerate(zip(mine, theirs)):
            if a == b:
                continue
            logits = hf_logits(path, prompt + theirs[:j])[-1]
            gap = float(logits[b] - logits[a])
            assert gap <= tol, (f"prompt of {len(prompt)} tokens: token {j} is {a}, the reference "
                                f"says {b}, whose logit is higher by {gap:.4f} > {tol}")
            break


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make-model", help="write a random-weight Llama folder")
    mk.add_argument("--preset", choices=sorted(PRESETS), required=True)
    mk.add_argument("--out", required=True)
    args = ap.parse_args()
    print(save_random_llama(args.out, args.preset))


if __name__ == "__main__":
    main()
