"""The hf-static target (transformers static-batch ``generate`` inside bench_serving): same greedy
tokens as the radixlm engine, per-request accounting of a static batch, and no streamed metrics."""

from __future__ import annotations

import pytest

from radixlm.srt.engine import Engine


@pytest.fixture(scope="module")
def two_requests(ds, stories_tok):
    reqs = ds.sample_random(stories_tok, 2, (4, 12), (4, 4), seed=3)
    assert reqs[0].prompt_len != reqs[1].prompt_len  # exercises left padding
    return reqs


def test_hf_static_equals_engine_greedy(bench, stories_path, stories_tok, two_requests):
    outs, duration = bench.hf_static_generate(stories_path, two_requests, stories_tok, batch_size=2)
    engine = Engine(stories_path, dtype="float32", max_total_tokens=4096)
    try:
        ref = engine.generate(input_ids=[stories_tok.encode(r.prompt) for r in two_requests],
                              sampling_params={"temperature": 0, "max_new_tokens": 4, "ignore_eos": True})
    finally:
        engine.shutdown()
    assert [o.output_ids for o in outs] == [r["output_ids"] for r in ref]
    assert all(len(o.output_ids) == 4 and o.success for o in outs) and duration > 0


def test_hf_static_batches_and_metrics(bench, ds, stories_path, stories_tok):
    reqs = ds.sample_random(stories_tok, 3, (4, 8), (2, 6), seed=5)
    args = bench.build_parser().parse_args(["--base-url", f"hf={stories_path}", "--backend", "hf-static",
                                            "--hf-batch-size", "2"])
    target = bench.parse_targets(args)[0]
    res = bench._run_target(target, reqs, args, stories_tok)
    assert not res.get("skipped"), res
    recs, m = res["requests"], res["metrics"]
    assert [r["output_len"] for r in recs] == [r.output_len for r in reqs]  # each keeps its own length
    assert recs[0]["latency"] == recs[1]["latency"] < recs[2]["latency"]  # batch {0, 1}, then batch {2}
    assert m["completed"] == 3 and m["batch_size"] == 2 and m["total_output_tokens"] == sum(r.output_len for r in reqs)
    assert m["mean_ttft_ms"] is None and m["mean_tpot_ms"] is None and m["mean_itl_ms"] is None
    assert m["mean_e2e_latency_ms"] > 0 and m["output_throughput"] > 0
    assert recs[0]["prompt_len"] == len(stories_tok.encode(reqs[0].prompt))  # BOS counted, as servers do


def test_hf_static_skips_json_schema(bench, ds, stories_path, stories_tok):
    reqs = ds.sample_json_schema(stories_tok, 1, (8, 16), 8)
    args = bench.build_parser().parse_args(["--base-url", f"hf={stories_path}", "--backend", "hf-static"])
    res = bench._run_target(bench.parse_targets(args)[0], reqs, args, stories_tok)
    assert "single-turn unconstrained" in res["skipped"]
