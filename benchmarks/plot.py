"""Plots from run_suite's JSONs (matplotlib; ``pip install 'radixlm[bench]'``):

- ``throughput_vs_concurrency.png``: output throughput (tok/s) vs max concurrency, a line per target,
  from ``sweep_c<N>.json``;
- ``ttft_cdf_shared_prefix.png``: the CDF of per-request TTFT (ms) per target on the shared-prefix
  workload, from ``shared_prefix.json`` (targets without a TTFT, such as hf-static, are left out).

    python benchmarks/plot.py --results-dir bench_results --out-dir docs/img

Without matplotlib it prints that the plots were skipped and exits 0. Returns the files written.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Optional


def sweep_series(results_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """{label: [(max concurrency, output tok/s), ...]} from ``sweep_c<N>.json`` (targets that ran)."""
    series: dict[str, list[tuple[int, float]]] = {}
    for p in sorted(results_dir.glob("sweep_c*.json")):
        m = re.fullmatch(r"sweep_c(\d+)\.json", p.name)
        if not m:
            continue
        for t in json.loads(p.read_text())["targets"]:
            if not t.get("skipped") and t["metrics"].get("completed"):
                series.setdefault(t["label"], []).append((int(m.group(1)), t["metrics"]["output_throughput"]))
    return {k: sorted(v) for k, v in series.items()}


def ttft_series(path: Path) -> dict[str, list[float]]:
    """{label: sorted TTFTs in ms} of the successful requests of one bench_serving JSON."""
    out = {}
    for t in json.loads(path.read_text())["targets"]:
        ttfts = sorted(r["ttft"] * 1000 for r in t.get("requests", []) if r["success"] and r.get("ttft") is not None)
        if ttfts:
            out[t["label"]] = ttfts
    return out


def plot(results_dir: Path, out_dir: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install 'radixlm[bench]')")
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    series = sweep_series(results_dir)
    if series:
        fig, ax = plt.subplots(figsize=(6, 4))
        for label, pts in series.items():
            ax.plot([c for c, _ in pts], [v for _, v in pts], marker="o", label=label)
        ax.set_xscale("log", base=2)
        concs = sorted({c for pts in series.values() for c, _ in pts})
        ax.set_xticks(concs, [str(c) for c in concs])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("max concurrency (requests in flight)")
        ax.set_ylabel("output throughput (tok/s)")
        ax.set_title("Throughput vs concurrency")
        ax.grid(True, alpha=0.3)
        ax.legend()
        written.append(_save(fig, out_dir / "throughput_vs_concurrency.png"))
    gsp = results_dir / "shared_prefix.json"
    ttfts = ttft_series(gsp) if gsp.exists() else {}
    if ttfts:
        fig, ax = plt.subplots(figsize=(6, 4))
        for label, vals in ttfts.items():
            ax.step([vals[0], *vals], [0.0, *((i + 1) / len(vals) for i in range(len(vals)))], where="post", label=label)
        ax.set_xlabel("TTFT (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title("TTFT CDF, generated-shared-prefix")
        ax.grid(True, alpha=0.3)
        ax.legend()
        written.append(_save(fig, out_dir / "ttft_cdf_shared_prefix.png"))
    if not written:
        print(f"plots: nothing to plot in {results_dir}")
    return written


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")
    return path


def main(argv: Optional[list[str]] = None) -> list[Path]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results-dir", default="bench_results")
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parents[1] / "docs" / "img"))
    args = ap.parse_args(argv)
    return plot(Path(args.results_dir), Path(args.out_dir))


if __name__ == "__main__":
    main()
