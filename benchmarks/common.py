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
    widths = {c: max([len(c), *(len(_fmt(r.get(c))) for r in rows)]) for c in columns}  # rows may be empty
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


# ---- child processes: a radixlm server (or another HTTP service) on a free loopback port ---------
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: Any, log: Any, wait_s: float) -> None:
    """SIGTERM ``proc`` (a ``subprocess.Popen``), SIGKILL it after ``wait_s`` seconds, close its ``log``."""
    import subprocess

    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log.close()


class Server:
    """``python -m radixlm.srt.launch_server`` with ``args`` on a free loopback port, its log in a temp
    file (``log_prefix``...``.log``); ready (``/health`` answers 200) when the constructor returns.

    Raises:
        RuntimeError: the server exited, or was not healthy after ``start_timeout_s`` seconds
            (it is stopped then); the message names the log file.
    """

    def __init__(self, args: list[str], start_timeout_s: float = 600.0, log_prefix: str = "bench_server_") -> None:
        import subprocess
        import sys
        import tempfile

        from radixlm.srt.health_wait import wait_healthy

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix=log_prefix, suffix=".log", delete=False)
        self.proc = subprocess.Popen([sys.executable, "-m", "radixlm.srt.launch_server", "--host", "127.0.0.1",
                                      "--port", str(self.port), *args], stdout=self.log, stderr=subprocess.STDOUT)
        outcome = wait_healthy(self.url, self.proc, start_timeout_s, poll_s=1.0)
        if outcome == "exited":
            raise RuntimeError(f"server exited ({self.proc.returncode}); log: {self.log.name}")
        if outcome == "timeout":
            self.stop()
            raise RuntimeError(f"server not healthy after {start_timeout_s} s; log: {self.log.name}")

    def state(self) -> dict:
        """The first scheduler's ``internal_states`` entry of ``/get_server_info``."""
        import httpx

        return httpx.get(self.url + "/get_server_info", timeout=30).json()["internal_states"][0]

    def stop(self) -> None:
        stop_process(self.proc, self.log, 60)


def report(name: str, args: Any, model: str, rows: list[dict[str, Any]], columns: list[str],
           raw: dict[str, Any]) -> dict[str, Any]:
    """Print the table and the load average, write the JSON (``args.output``); returns the payload."""
    print_table(rows, columns)
    load = os.getloadavg()
    payload = {"benchmark": name, "args": vars(args), "model": model, "loadavg_at_end": load,
               "cpu_count": os.cpu_count(), "table": rows, "runs": raw}
    write_json(args.output, payload)
    print(f"load average at end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; wrote {args.output}")
    return payload
