"""The speculative-decoding benchmark pieces: the copy-edit workload, the acceptance-length metric,
the identical-outputs check, the suite's ngram workloads and their summary table."""

from __future__ import annotations

import json
import shlex

import pytest

from tests.benchmarks.conftest import load


def test_copy_edit_prompts_are_deterministic_and_copy_heavy(ds, stories_tok):
    a = ds.sample_copy_edit(stories_tok, 9, 64, seed=0)
    assert a == ds.sample_copy_edit(stories_tok, 9, 64, seed=0)
    assert [r.prompt for r in a] != [r.prompt for r in ds.sample_copy_edit(stories_tok, 9, 64, seed=1)]
    assert [r.extra["kind"] for r in a] == ["json", "code", "quote"] * 3
    for r in a:
        assert r.ignore_eos and 1 <= r.output_len <= 64 and r.prompt_len == len(stories_tok.encode(r.prompt, add_special_tokens=False))
    doc = json.loads(a[0].prompt.split("Input JSON:\n", 1)[1].split("\n\nThe same JSON", 1)[0])
    assert isinstance(doc, list) and {"name", "city", "age"} <= set(doc[0])
    assert a[1].prompt.endswith("```python\n") and a[2].prompt.endswith("Quote:\n")


def test_spec_accept_length_is_weighted_by_verify_steps(bench):
    outs = [bench.RequestOutput(success=True, output_len=10, ttft=0.1, latency=1.0, spec_verify_ct=2, spec_accept_length=4.0),
            bench.RequestOutput(success=True, output_len=10, ttft=0.1, latency=1.0, spec_verify_ct=6, spec_accept_length=1.0),
            bench.RequestOutput(success=True, output_len=3, ttft=0.1, latency=1.0)]
    assert bench.compute_metrics(outs, 1.0)["spec_accept_length"] == pytest.approx((8 + 6) / 8)
    assert "spec_accept_length" not in bench.compute_metrics(outs[2:], 1.0)


def test_identical_outputs(bench):
    def target(label, texts):
        return {"label": label, "requests": [{"text": t} for t in texts]}

    res = [target("radixlm", ["a", "b"]), target("radixlm-ngram", ["a", "b"]), target("other", ["a", "c"]),
           {"label": "gone", "skipped": "down", "requests": []}]
    assert bench.identical_outputs(res) == {"radixlm-ngram": True, "other": False}
    assert bench.identical_outputs(res[:1]) == {}


def test_suite_runs_ngram_targets_only_in_ngram_workloads():
    suite = load("run_suite")
    _, targets = suite.parse_targets(shlex.split("--base-url radixlm=http://h:1 --backend radixlm "
                                                 "--base-url radixlm-ngram=http://h:2 --backend radixlm"))
    assert "radixlm-ngram=http://h:2" not in suite.target_flags("shared_prefix", None, targets)
    names = {n: (labels, wl) for n, labels, wl in suite.workloads(False)}
    for n in ("ngram_copy_c1", "ngram_copy_c8", "ngram_random"):
        labels, wl = names[n]
        assert suite.target_flags(n, labels, targets).count("--base-url") == 2
    assert names["ngram_copy_c1"][1][names["ngram_copy_c1"][1].index("--max-concurrency") + 1] == "1"
    assert names["ngram_copy_c8"][1][names["ngram_copy_c8"][1].index("--max-concurrency") + 1] == "8"


def test_summary_speculative_table():
    summary = load("summary")
    m = {"output_throughput": 10.0, "median_tpot_ms": 100.0}
    payload = {"identical_outputs": {"radixlm-ngram": True},
               "targets": [{"label": "radixlm", "metrics": m},
                           {"label": "radixlm-ngram", "metrics": {**m, "output_throughput": 18.0, "spec_accept_length": 3.2}}]}
    lines = summary.speculative_table(payload)
    assert lines[2] == "| radixlm | 10 | 1 | – | 100 | – |"
    assert lines[3] == "| radixlm-ngram | 18 | 1.8 | 3.2 | 100 | yes |"
