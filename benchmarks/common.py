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
    "stories260k": str(Path(__file__).resolve().parents[1].parent / "shared" / "models" / "stories260k-hf"),
    "smollm2": None,  # the demo model (resolved by radixlm)
}


def resolve_model(name_or_path: str) -> Optional[str]:
    return MODELS.get(name_or_path, name_or_path)


def random_ids(rng: random.Random, n: int, vocab_size: int, low: int = 3) -> list[int]:
    """n token ids uniform in [low, vocab_size) (skips the usual special ids 0..2)."""
    return [rng.randrange(low, vocab_size) for _ in range(n)]


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
        "cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}, **payload}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload, indent=2))
    print(f"wrote {path}")
