"""run_suite / summary / plot from fixture JSONs (no server), the hf-serve and per-target
json-schema payloads, and (slow) ``QUICK=1 benchmarks/run_all.sh`` end to end on stories260K."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import BENCH, load


def _target(label, out_tps, ttfts=(0.1, 0.2), skipped=None, **metrics):
    if skipped:
        return {"label": label, "skipped": skipped, "metrics": {}, "requests": []}
    m = {"completed": len(ttfts), "failed": 0, "output_throughput": out_tps, "request_throughput": out_tps / 10,
         "median_ttft_ms": 150.0, "median_tpot_ms": 20.0, "median_e2e_latency_ms": 900.0, "cache_hit_rate": 0.8,
         "mean_tpot_ms": 20.0, **metrics}
    return {"label": label, "metrics": m,
            "requests": [{"success": True, "ttft": t, "latency": 1.0} for t in ttfts]}


def _payload(dataset, targets, conc=None, **ds_params):
    return {"timestamp": "2026-11-29T12:00:00", "machine": {"loadavg": [1.5, 1, 1]}, "tokenizer": "/m/smollm2",
            "dataset": {"name": dataset, "seed": 0, **ds_params}, "max_concurrency": conc, "targets": targets}


@pytest.fixture
def results(tmp_path):
    d = tmp_path / "res"
    d.mkdir()
    (d / "shared_prefix.json").write_text(json.dumps(_payload("generated-shared-prefix", [
        {**_target("radixlm", 100.0, ttfts=(0.05, 0.1, 0.3)), "cache_flush": "/flush_cache"},
        {**_target("radixlm-nocache", 25.0), "cache_flush": "/flush_cache"},
        _target("vllm", None, skipped="ConnectError: refused"),
        _target("hf-static", 20.0, ttfts=(None, None), median_ttft_ms=None)], gsp_num_groups=8)))
    (d / "decode_heavy.json").write_text(json.dumps(_payload("random", [
        {**_target("radixlm", 60.0), "cache_flush": "/flush_cache"},
        {**_target("vllm", 50.0), "cache_flush": "/reset_prefix_cache"},
        {**_target("llama-server", 30.0), "cache_flush": None}], random_input_len=[64, 128])))
    (d / "json_schema.json").write_text(json.dumps(_payload("json-schema", [
        _target("radixlm", 40.0, mean_tpot_ms=22.0, json_valid_rate=1.0),
        _target("radixlm-free", 45.0, mean_tpot_ms=20.0, json_valid_rate=0.0)], conc=16)))
    (d / "tool_calls.json").write_text(json.dumps(_payload("tool-calls", [
        {**_target("radixlm-required", 30.0, mean_tpot_ms=30.0, median_ttft_ms=300.0, tool_call_rate=1.0),
         "tool_choice": "required"},
        {**_target("radixlm-none", 40.0, mean_tpot_ms=24.0, median_ttft_ms=200.0, tool_call_rate=0.0),
         "tool_choice": "none"}], conc=4)))
    for c, tps in ((1, 10.0), (4, 35.0), (16, 90.0)):
        (d / f"sweep_c{c}.json").write_text(json.dumps(_payload("random", [
            _target("radixlm", tps), _target("llama-server", tps / 2)], conc=c, num_prompts=max(8, 2 * c),
            random_input_len=[64, 128], random_output_len=[128, 128])))
    return d


def test_summary_tables(results):
    md = load("summary").summarize(results)
    assert "### shared_prefix" in md and "load average 1.5" in md
    assert "| radixlm-nocache | 25 | 4 |" in md  # radixlm ÷ system = 100 / 25
    shared, heavy = md.split("### decode_heavy")[0], md.split("### decode_heavy")[1].split("###")[0]
    assert "†" not in shared  # every target that ran was flushed (old JSONs without the key: no mark)
    assert "| vllm | 50 | 1.2 |" in heavy and "| llama-server † | 30 | 2 |" in heavy
    assert "† prefix cache not emptied" in heavy
    assert "| vllm | skipped: ConnectError: refused |" in md
    assert "| hf-static | 20 | 5 | 2 | – |" in md  # no TTFT for a static batch
    assert "| radixlm | 22 | 1.1 | 40 | 1 |" in md  # constrained TPOT / unconstrained TPOT
    assert "| system | c=1 | c=4 | c=16 |" in md and "| llama-server | 5 | 17.5 | 45 |" in md
    assert "c=16: 32" in md
    assert "### tool_calls" in md
    assert "| radixlm-required | required | 300 | 1.5 | 30 | 1.25 | 30 | 1 |" in md  # ÷ the same server, none
    assert "| radixlm-none | none | 200 | – | 24 | – | 40 | 0 |" in md


def test_plot_writes_pngs(results, tmp_path):
    pytest.importorskip("matplotlib")
    plot = load("plot")
    written = plot.main(["--results-dir", str(results), "--out-dir", str(tmp_path / "img")])
    assert sorted(p.name for p in written) == ["throughput_vs_concurrency.png", "ttft_cdf_shared_prefix.png"]
    assert all(p.stat().st_size > 1000 and p.read_bytes()[:4] == b"\x89PNG" for p in written)
    assert plot.sweep_series(results)["llama-server"] == [(1, 5.0), (4, 17.5), (16, 45.0)]
    assert set(plot.ttft_series(results / "shared_prefix.json")) == {"radixlm", "radixlm-nocache"}


def test_plot_without_matplotlib(results, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    assert load("plot").plot(results, tmp_path / "img") == []
    assert "plots skipped" in capsys.readouterr().out


def test_suite_targets_per_workload():
    suite = load("run_suite")
    flags = shlex.split("--tokenizer /m --base-url radixlm=http://h:1 --backend radixlm "
                        "--base-url radixlm-nocache=http://h:2 --backend radixlm --base-url vllm=http://h:3 "
                        "--backend openai --base-url hf-static=/m --backend hf-static")
    other, targets = suite.parse_targets(flags)
    assert other == ["--tokenizer", "/m"] and [t[0] for t in targets] == ["radixlm", "radixlm-nocache", "vllm", "hf-static"]
    assert suite.target_flags("shared_prefix", None, targets).count("--base-url") == 4
    assert "radixlm-nocache=http://h:2" not in suite.target_flags("random", suite.NO_NOCACHE, targets)
    js = suite.target_flags("json_schema", ("radixlm", "vllm"), targets)
    assert js == ["--base-url", "radixlm=http://h:1", "--backend", "radixlm", "--json-schema-field", "auto",
                  "--base-url", "radixlm-free=http://h:1", "--backend", "radixlm", "--json-schema-field", "none",
                  "--base-url", "vllm=http://h:3", "--backend", "openai", "--json-schema-field", "response_format",
                  "--base-url", "vllm-free=http://h:3", "--backend", "openai", "--json-schema-field", "none"]
    tools = suite.target_flags("tool_calls", ("radixlm",), targets)
    assert tools == [x for c in ("required", "auto", "none") for x in
                     ("--base-url", f"radixlm-{c}=http://h:1", "--backend", "openai-chat", "--tool-choice", c)]
    for quick in (False, True):  # every workload's flags parse
        for name, _, wl in suite.workloads(quick):
            load("bench_serving").build_parser().parse_args([*wl, "--output", "x"])
    full = {name: wl for name, _, wl in suite.workloads(False)}
    assert full["decode_heavy"][full["decode_heavy"].index("--max-concurrency") + 1] == "64"
    assert [n for n in full if n.startswith("sweep")] == ["sweep_c1", "sweep_c4", "sweep_c16", "sweep_c64"]
    assert [n for n in full if n.startswith("busy2")] == ["busy2_shared_prefix", "busy2_c1"]
    assert all(full[n][full[n].index("--busy-procs") + 1] == "2" for n in full if n.startswith("busy2"))


def test_busy_processes_run_during_the_block_and_stop_after():
    import time

    busy = load("contention").busy_processes
    with busy(2) as pids:
        assert len(pids) == 2
        time.sleep(0.3)
        for pid in pids:  # running and using CPU
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            assert stat[0] in "RS"
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_hf_serve_and_schema_field_payloads(bench, ds, stories_tok):
    args = bench.build_parser().parse_args(["--base-url", "a=http://h:1", "--backend", "hf-serve"])
    t = bench.parse_targets(args)[0]
    req = ds.sample_random(stories_tok, 1, (4, 4), (8, 8))[0]
    body = bench._openai_payload(t, req, req.prompt, args)
    assert "ignore_eos" not in body and "stream_options" not in body  # transformers serve: 422 on unknown fields
    assert json.loads(body["generation_config"]) == {"eos_token_id": -1} and body["max_tokens"] == 8
    js = ds.sample_json_schema(stories_tok, 1, (8, 16), 8)[0]
    args = bench.build_parser().parse_args(["--base-url", "a=http://h", "--base-url", "b=http://h",
                                            "--backend", "radixlm", "--json-schema-field", "auto",
                                            "--json-schema-field", "none"])
    on, off = bench.parse_targets(args)
    assert "json_schema" in bench._native_payload(on, js, js.prompt, args)["sampling_params"]
    assert "json_schema" not in bench._native_payload(off, js, js.prompt, args)["sampling_params"]
    off.backend = "openai"
    body = bench._openai_payload(off, js, js.prompt, args)
    assert "json_schema" not in body and "response_format" not in body
    with pytest.raises(SystemExit):
        bench.parse_targets(bench.build_parser().parse_args(["--json-schema-field", "bogus"]))


@pytest.mark.slow
def test_run_all_quick(stories_path, tmp_path):
    """The whole chain on stories260K: servers up, every QUICK workload, summary, plots, servers down."""
    env = {**os.environ, "QUICK": "1", "MODEL_DIR": stories_path, "PEERS": "radixlm radixlm-nocache hf-static",
           "OUT_DIR": str(tmp_path / "res"), "IMG_DIR": str(tmp_path / "img"), "RADIXLM_PYTHON": sys.executable}
    r = subprocess.run(["bash", str(BENCH / "run_all.sh")], env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = tmp_path / "res"
    names = {p.stem for p in res.glob("*.json")}
    assert names == {"shared_prefix", "decode_heavy", "random", "json_schema", "tool_calls", "sweep_c1", "sweep_c2",
                     "sweep_c4", "busy2_c1", "ngram_copy_c1", "ngram_copy_c8", "ngram_random"}
    assert json.loads((res / "busy2_c1.json").read_text())["busy_procs"] == 2
    gsp = json.loads((res / "shared_prefix.json").read_text())
    assert [t["label"] for t in gsp["targets"]] == ["radixlm", "radixlm-nocache", "hf-static"]
    assert all(t["metrics"]["failed"] == 0 and t["metrics"]["completed"] == 4 for t in gsp["targets"])
    assert "### json_schema" in (res / "summary.md").read_text()
    if Path(tmp_path / "img").exists():
        assert (tmp_path / "img" / "throughput_vs_concurrency.png").exists()
