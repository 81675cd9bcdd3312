"""Helpers shared by the benchmark scripts: model resolution, seeded prompts, table + JSON output."""

from __future__ import annotations

import json
import os
import platform
import random
import time
from pathlib import Path
from typing import Any, Optional

MODELS = {
    "stories260k": str(Path(__file__).resolve().parents[1] / "tests" / "assets" / "models" / "stories260k-hf"),
    "smollm2": None,  # the demo model (resolved by radixlm)
}


def resolve_model(name_or_path: str) -> Optional[str]:
    return MODELS.get(name_or_path, name_or_path)


def random_ids(rng: random.Random, n: int, vocab_size: int, low: int = 3) -> list[int]:
    """n token ids uniform in [low, vocab_size) (skips the usual special ids 0..2)."""
    return [rng.randrange(low, vocab_size) for _ in range(n)]


def load_hf_model(path: str) -> Any:
    """A transformers causal LM from a local folder, fp32, eval mode (the static-batching baseline)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_generate(model: Any, prompts: list[list[int]], out_len: int, pad_id: int = 0) -> list[list[int]]:
    """One static batch of transformers ``generate``: left-padded ``prompts`` (token ids), greedy,
    exactly ``out_len`` new tokens each (``min_new_tokens = max_new_tokens``, so EOS cannot end a row
    early). Returns the new token ids per prompt."""
    import torch

    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])  # left padding
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        g = model.generate(ids, attention_mask=mask, max_new_tokens=out_len, min_new_tokens=out_len,
                           do_sample=False, pad_token_id=pad_id)
    return g[:, width:].tolist()


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.rjust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).rjust(widths[c]) for c in columns))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def write_json(path: str, payload: dict[str, Any]) -> None:
    payload = {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": {
        "cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
        "loadavg": list(os.getloadavg())}, **payload}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload, indent=2))
    print(f"wrote {path}")
