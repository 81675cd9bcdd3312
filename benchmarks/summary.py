"""Markdown tables from run_suite's JSONs (one per workload), to paste into docs/benchmarks.md.

    python benchmarks/summary.py --results-dir bench_results --output bench_results/summary.md

A table per workload JSON, a row per target: output throughput (tok/s) and radixlm's multiple of it
(radixlm ÷ target: the issue's targets are "radixlm ≥ N× peer"), request throughput (req/s),
median TTFT / TPOT / end-to-end latency (ms), cache hit rate. ``json_schema``: mean TPOT (ms) per
target and its ratio to the same server unconstrained (``<label>-free``; the issue's target is ≤ 1.2).
``tool_calls``: per target its ``tool_choice``, median TTFT, mean TPOT and their ratios to the same
server with ``tool_choice`` none (or omit), output tok/s, the share of requests that produced valid calls.
``ngram_*`` JSONs (speculative decoding): output tok/s, its ratio to radixlm (speculation off), the
acceptance length and whether the outputs equal radixlm's. ``sweep_c*`` JSONs: one table of output throughput (tok/s) per target × max concurrency.
Skipped targets appear with the reason. Missing metrics print as ``–``.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any, Optional

ORDER = ["shared_prefix", "decode_heavy", "random", "json_schema", "tool_calls", "ngram_copy_c1", "ngram_copy_c8", "ngram_random"]


def fmt(v: Any, digits: int = 3) -> str:
    """A number to ``digits`` significant digits (``–`` for None)."""
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 10 ** digits else f"{v:.0f}"
    return str(v)


def _base(targets: list[dict]) -> Optional[dict]:
    """The reference target: label ``radixlm`` if it ran, else the first that ran."""
    ran = [t for t in targets if not t.get("skipped")]
    return next((t for t in ran if t["label"] == "radixlm"), ran[0] if ran else None)


def describe(payload: dict) -> str:
    """One line: dataset parameters, concurrency, tokenizer, time, load average."""
    ds = {k: v for k, v in payload["dataset"].items() if k not in ("name", "seed")}
    params = ", ".join(f"{k}={v}" for k, v in ds.items())
    m = payload.get("machine", {})
    load = m.get("loadavg")
    return (f"{payload['dataset']['name']} ({params}), max concurrency {payload.get('max_concurrency') or 'none'}, "
            f"{Path(payload.get('tokenizer', '?')).name}, {payload.get('timestamp', '?')}"
            + (f", load average {load[0]:.1f}" if load else ""))


def throughput_table(payload: dict) -> list[str]:
    """Rows per target: output tok/s, radixlm ÷ target, req/s, TTFT / TPOT / E2E medians, cache hits."""
    targets = payload["targets"]
    base = _base(targets)
    lines = ["| system | output tok/s | radixlm ÷ system | req/s | TTFT p50 (ms) | TPOT p50 (ms) | E2E p50 (ms) | cache hit rate |",
             "|---|---|---|---|---|---|---|---|"]
    for t in targets:
        if t.get("skipped"):
            lines.append(f"| {t['label']} | skipped: {t['skipped'][:80]} | | | | | | |")
            continue
        m = t["metrics"]
        ratio = base["metrics"]["output_throughput"] / m["output_throughput"] if base and m["output_throughput"] else None
        failed = f" ({m['failed']} failed)" if m.get("failed") else ""
        kept = " †" if "cache_flush" in t and t["cache_flush"] is None else ""
        lines.append(f"| {t['label']}{kept}{failed} | {fmt(m['output_throughput'])} | {fmt(ratio)} | {fmt(m['request_throughput'])} "
                     f"| {fmt(m['median_ttft_ms'])} | {fmt(m['median_tpot_ms'])} | {fmt(m['median_e2e_latency_ms'])} "
                     f"| {fmt(m['cache_hit_rate'])} |")
    if any("cache_flush" in t and t["cache_flush"] is None for t in targets if not t.get("skipped")):
        lines += ["", "† prefix cache not emptied before the run (the server has no flush route, or it refused): "
                      "its hits may come from an earlier round or workload."]
    return lines


def json_schema_table(payload: dict) -> list[str]:
    """Rows per target: mean TPOT, ratio to ``<label>-free`` (same server, no schema), valid JSON rate."""
    by_label = {t["label"]: t for t in payload["targets"]}
    lines = ["| system | mean TPOT (ms) | TPOT ÷ unconstrained | output tok/s | valid JSON |", "|---|---|---|---|---|"]
    for t in payload["targets"]:
        if t.get("skipped"):
            lines.append(f"| {t['label']} | skipped: {t['skipped'][:80]} | | | |")
            continue
        m = t["metrics"]
        free = by_label.get(f"{t['label']}-free", {}).get("metrics", {})
        ratio = m["mean_tpot_ms"] / free["mean_tpot_ms"] if free.get("mean_tpot_ms") and m["mean_tpot_ms"] else None
        lines.append(f"| {t['label']} | {fmt(m['mean_tpot_ms'])} | {fmt(ratio)} | {fmt(m['output_throughput'])} "
                     f"| {fmt(m.get('json_valid_rate'))} |")
    return lines


def _server_label(t: dict) -> str:
    """A tool-calls target's label without its ``-<tool_choice>`` suffix."""
    suffix = f"-{t.get('tool_choice')}"
    return t["label"][:-len(suffix)] if t["label"].endswith(suffix) else t["label"]


def tool_calls_table(payload: dict) -> list[str]:
    """Rows per target: tool_choice, TTFT / TPOT and their ratios to the same server unconstrained
    (tool_choice none or omit), output tok/s, valid-call rate."""
    targets = payload["targets"]
    lines = ["| system | tool_choice | TTFT p50 (ms) | TTFT ÷ unconstrained | mean TPOT (ms) | TPOT ÷ unconstrained "
             "| output tok/s | valid calls |", "|---|---|---|---|---|---|---|---|"]
    for t in targets:
        if t.get("skipped"):
            lines.append(f"| {t['label']} | {t.get('tool_choice', '')} | skipped: {t['skipped'][:80]} | | | | | |")
            continue
        m = t["metrics"]
        free = next((u["metrics"] for u in targets if not u.get("skipped") and _server_label(u) == _server_label(t)
                     and u.get("tool_choice") in ("none", "omit")), {})

        def ratio(key: str) -> Optional[float]:
            return m[key] / free[key] if free.get(key) and m.get(key) and free is not m else None

        lines.append(f"| {t['label']} | {t.get('tool_choice', '')} | {fmt(m['median_ttft_ms'])} "
                     f"| {fmt(ratio('median_ttft_ms'))} | {fmt(m['mean_tpot_ms'])} | {fmt(ratio('mean_tpot_ms'))} "
                     f"| {fmt(m['output_throughput'])} | {fmt(m.get('tool_call_rate'))} |")
    return lines


def speculative_table(payload: dict) -> list[str]:
    """Rows per target: output tok/s, ÷ radixlm (speculation off), spec_accept_length, same outputs."""
    base = _base(payload["targets"])
    same = payload.get("identical_outputs", {})
    lines = ["| system | output tok/s | ÷ radixlm | spec_accept_length | TPOT p50 (ms) | outputs = radixlm |",
             "|---|---|---|---|---|---|"]
    for t in payload["targets"]:
        if t.get("skipped"):
            lines.append(f"| {t['label']} | skipped: {t['skipped'][:80]} | | | | |")
            continue
        m = t["metrics"]
        ratio = m["output_throughput"] / base["metrics"]["output_throughput"] if base and base["metrics"]["output_throughput"] else None
        eq = "–" if t is base else ("yes" if same.get(t["label"]) else "NO")
        lines.append(f"| {t['label']} | {fmt(m['output_throughput'])} | {fmt(ratio)} | {fmt(m.get('spec_accept_length'))} "
                     f"| {fmt(m['median_tpot_ms'])} | {eq} |")
    return lines


def sweep_table(payloads: dict[int, dict]) -> list[str]:
    """Output tok/s per target (rows) × max concurrency (columns)."""
    concs = sorted(payloads)
    labels: list[str] = []
    for c in concs:
        labels += [t["label"] for t in payloads[c]["targets"] if t["label"] not in labels]
    lines = ["| system | " + " | ".join(f"c={c}" for c in concs) + " |", "|---|" + "---|" * len(concs)]
    for label in labels:
        cells = []
        for c in concs:
            t = next((t for t in payloads[c]["targets"] if t["label"] == label), None)
            cells.append("skipped" if t is None or t.get("skipped") else fmt(t["metrics"]["output_throughput"]))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def sweep_payloads(results_dir: Path) -> dict[int, dict]:
    """``sweep_c<N>.json`` files by N."""
    out = {}
    for p in results_dir.glob("sweep_c*.json"):
        m = re.fullmatch(r"sweep_c(\d+)\.json", p.name)
        if m:
            out[int(m.group(1))] = json.loads(p.read_text())
    return out


def summarize(results_dir: Path) -> str:
    """The markdown for every workload JSON found in ``results_dir``."""
    parts = []
    for name in ORDER:
        p = results_dir / f"{name}.json"
        if not p.exists():
            continue
        payload = json.loads(p.read_text())
        kind = payload["dataset"]["name"]
        if kind == "json-schema":
            table = json_schema_table(payload)
        elif kind == "tool-calls":
            table = tool_calls_table(payload)
        elif name.startswith("ngram_"):
            table = speculative_table(payload)
        else:
            table = throughput_table(payload)
        parts.append("\n".join([f"### {name}", "", describe(payload), "", *table]))
    sweep = sweep_payloads(results_dir)
    if sweep:
        d = sweep[min(sweep)]["dataset"]
        head = (f"{d['name']}, input {d.get('random_input_len')}, output {d.get('random_output_len')}; requests at "
                + ", ".join(f"c={c}: {sweep[c]['dataset'].get('num_prompts')}" for c in sorted(sweep)))
        parts.append("\n".join(["### throughput vs concurrency (output tok/s)", "", head, "", *sweep_table(sweep)]))
    return "\n\n".join(parts) + "\n"


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results-dir", default="bench_results")
    ap.add_argument("--output", default=None, help="default: <results-dir>/summary.md")
    args = ap.parse_args(argv)
    md = summarize(Path(args.results_dir))
    out = Path(args.output or Path(args.results_dir) / "summary.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md)
    print(md)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
