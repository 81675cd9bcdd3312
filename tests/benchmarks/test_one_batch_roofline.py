"""bench_one_batch's roofline columns: the bytes a decode step must read (every weight as stored plus
the attended KV cache) and the best share of the matmul peak a step can reach at the measured read
bandwidth. Checked against the checkpoint's own tensor sizes on stories260K (fp32, unpacked weights)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from safetensors import safe_open

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_one_batch.py"


def test_roofline_columns_count_weights_and_kv(stories_path, tmp_path):
    out = tmp_path / "one_batch.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--model", stories_path, "--batch-sizes", "1", "4",
                           "--input-lens", "16", "--output-lens", "4", "--gemm-backends", "torch_native",
                           "--dtype", "float32", "--threads", "1", "--output", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "memory read bandwidth:" in proc.stdout
    data = json.loads(out.read_text())
    bandwidth = data["read_bandwidth_gb_s"]
    assert 0.5 < bandwidth < 2000
    cfg = json.loads((Path(stories_path) / "config.json").read_text())
    with safe_open(str(Path(stories_path) / "model.safetensors"), "pt") as f:
        # the linears (q, k, v, o, gate, up, down) and the LM head, fp32 as loaded: 4 bytes a weight
        weights = 4 * sum(f.get_slice(n).get_shape()[0] * f.get_slice(n).get_shape()[1] for n in f.keys()
                          if n.endswith("proj.weight") or n == "lm_head.weight")
    assert weights > 0
    rows = {r["batch"]: r for r in data["rows"]}
    assert set(rows) == {1, 4}
    for bs, r in rows.items():
        context = 16 + 4 / 2
        kv = bs * context * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 2 * 4
        assert r["bytes_per_step"] == weights + kv, (bs, r["bytes_per_step"], weights, kv)
        flops = bs * r["model_gflop_s"] * 1e9 / r["decode_tok_s"]
        peak = data["matmul_peak_gflop_s"]["float32"] * 1e9
        floor = max(r["bytes_per_step"] / (bandwidth * 1e9), flops / peak)
        assert abs(r["roofline_ms"] - 1000 * floor) < 1e-6 * max(1.0, r["roofline_ms"])
        assert 0 < r["roofline_pct_of_peak"] <= 100 + 1e-9
        assert abs(r["roofline_pct_of_peak"] - 100 * flops / floor / peak) < 1e-6
        assert abs(r["pct_of_roofline"] - 100 * r["roofline_ms"] / r["decode_step_ms"]) < 1e-6
    # four requests read the same weights and four times the KV of one
    assert rows[4]["bytes_per_step"] - rows[1]["bytes_per_step"] == 3 * (rows[1]["bytes_per_step"] - weights)
