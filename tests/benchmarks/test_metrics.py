"""Metric math on synthetic timings, Poisson arrivals, target parsing and the ratio table."""

from __future__ import annotations

import asyncio
import math
import random

import pytest


def _out(bench, ttft, latency, n_out, itl, prompt=10, cached=None):
    return bench.RequestOutput(success=True, prompt_len=prompt, output_len=n_out, cached_tokens=cached,
                               ttft=ttft, latency=latency, itl=list(itl))


def test_compute_metrics(bench):
    outs = [_out(bench, 0.1, 0.5, 5, [0.1] * 4, prompt=10, cached=0),
            _out(bench, 0.3, 1.1, 9, [0.1] * 8, prompt=30, cached=20),
            _out(bench, 0.2, 0.2, 1, [], prompt=20),  # 1 token: no TPOT; no cached_tokens reported
            bench.RequestOutput(error="boom")]
    m = bench.compute_metrics(outs, duration_s=2.0)
    assert (m["completed"], m["failed"]) == (3, 1)
    assert (m["total_input_tokens"], m["total_output_tokens"]) == (60, 15)
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["input_throughput"] == pytest.approx(30) and m["output_throughput"] == pytest.approx(7.5)
    assert m["mean_ttft_ms"] == pytest.approx(200) and m["median_ttft_ms"] == pytest.approx(200)
    assert m["p99_ttft_ms"] == pytest.approx(298.0)  # linear interpolation between 200 and 300
    # TPOT = (latency - ttft) / (n - 1): 0.4 / 4 = 100 ms and 0.8 / 8 = 100 ms
    assert m["mean_tpot_ms"] == pytest.approx(100) and m["p99_tpot_ms"] == pytest.approx(100)
    assert m["mean_itl_ms"] == pytest.approx(100) and m["median_itl_ms"] == pytest.approx(100)
    assert m["mean_e2e_latency_ms"] == pytest.approx(600)
    assert m["cache_hit_rate"] == pytest.approx(20 / 40)  # only the requests that reported it
    assert m["concurrency"] == pytest.approx(1.8 / 2.0)


def test_tier_hit_rates(bench):
    a = _out(bench, 0.1, 0.5, 5, [0.1] * 4, prompt=40, cached=30)
    a.cached_tokens_details = {"device": 10, "host": 20, "storage": 0}
    b = _out(bench, 0.1, 0.5, 5, [0.1] * 4, prompt=60, cached=50)
    b.cached_tokens_details = {"device": 0, "host": 10, "storage": 40}
    plain = _out(bench, 0.1, 0.5, 5, [0.1] * 4, prompt=100, cached=0)  # no details: not counted
    m = bench.compute_metrics([a, b, plain], duration_s=1.0)
    assert m["cache_hit_rate_device"] == pytest.approx(10 / 100)
    assert m["cache_hit_rate_host"] == pytest.approx(30 / 100)
    assert m["cache_hit_rate_storage"] == pytest.approx(40 / 100)
    assert "cache_hit_rate_host" not in bench.compute_metrics([plain], 1.0)


def test_percentiles_and_empty(bench):
    s = bench._stats([i / 1000 for i in range(1, 101)])  # 1..100 ms
    assert s["mean"] == pytest.approx(50.5) and s["median"] == pytest.approx(50.5)
    assert s["p99"] == pytest.approx(99.01)
    m = bench.compute_metrics([bench.RequestOutput(error="x")], 1.0)
    assert m["completed"] == 0 and m["mean_ttft_ms"] is None and m["cache_hit_rate"] is None


def test_poisson_arrivals_deterministic(bench):
    async def times(rate, seed):
        loop, t0, out = asyncio.get_running_loop(), None, []
        t0 = loop.time()
        async for _ in bench._arrivals(5, rate, random.Random(seed)):
            out.append(loop.time() - t0)
        return out

    assert max(asyncio.run(times(math.inf, 0))) < 0.05  # all at once
    gaps = [random.Random(0).expovariate(200.0)]
    assert asyncio.run(times(200.0, 0))[1] >= gaps[0] * 0.9


def test_parse_targets(bench):
    ap = bench.build_parser()
    t = bench.parse_targets(ap.parse_args(["--base-url", "a=http://h:1/", "--base-url", "http://h:2",
                                           "--backend", "radixlm", "--backend", "openai"]))
    assert [(x.label, x.url, x.backend) for x in t] == [("a", "http://h:1", "radixlm"), ("openai1", "http://h:2", "openai")]
    with pytest.raises(SystemExit):
        bench.parse_targets(ap.parse_args(["--base-url", "http://x", "--backend", "a", "--backend", "b"]))
    # several --tool-choice values with one server: that server once per value
    t = bench.parse_targets(ap.parse_args(["--base-url", "r=http://h:1", "--backend", "openai-chat",
                                           "--tool-choice", "required", "--tool-choice", "none"]))
    assert [(x.label, x.url, x.tool_choice) for x in t] == [("r-required", "http://h:1", "required"),
                                                            ("r-none", "http://h:1", "none")]
    with pytest.raises(SystemExit):
        bench.parse_targets(ap.parse_args(["--tool-choice", "sometimes"]))


def test_tool_call_payload_and_stream_merging(bench, ds, stories_tok):
    req = ds.sample_tool_calls(stories_tok, 1, 32)[0]
    args = bench.build_parser().parse_args([])
    target = bench.Target("t", "http://h", "openai-chat", "m", tool_choice="required")
    body = bench._openai_payload(target, req, bench._prompt_for(target, req), args)
    assert body["tools"] == ds.TOOLS and body["tool_choice"] == "required" and "ignore_eos" not in body
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    target.tool_choice = "omit"
    assert "tools" not in bench._openai_payload(target, req, body["messages"], args)
    out = bench.RequestOutput()
    n = bench._add_call_deltas(out.tool_calls, [{"index": 0, "id": "c", "type": "function",
                                                 "function": {"name": "get_weather", "arguments": ""}}])
    n += bench._add_call_deltas(out.tool_calls, [{"index": 0, "function": {"arguments": '{"city": "Oslo"}'}}])
    assert n == len("get_weather") + len('{"city": "Oslo"}') and bench._valid_calls(out)
    out.tool_calls[1] = {"name": "get_time", "arguments": '{"zone": '}  # cut short: not valid
    assert not bench._valid_calls(out) and not bench._valid_calls(bench.RequestOutput())


def test_report_ratios(bench, capsys):
    rows = bench.report([{"label": "r", "metrics": {"output_throughput": 10.0, "cache_hit_rate": None}},
                         {"label": "v", "metrics": {"output_throughput": 25.0, "cache_hit_rate": 0.5}}])
    row = next(r for r in rows if r["metric"] == "output_throughput")
    assert row["v/r"] == pytest.approx(2.5)
    assert next(r for r in rows if r["metric"] == "cache_hit_rate")["v/r"] is None
    assert "v/r" in capsys.readouterr().out


def test_rounds_alternate_the_order_and_keep_each_targets_best(bench):
    """--rounds N: forwards, backwards, forwards ... so neither system always goes first into a slow
    phase of the host; per target the round with the highest output throughput is reported, every
    round's figure kept beside it, and a skipped round (no metrics) counts as 0."""
    assert bench.round_orders(2, 1) == [[0, 1]]
    assert bench.round_orders(2, 3) == [[0, 1], [1, 0], [0, 1]]
    assert bench.round_orders(3, 2) == [[0, 1, 2], [2, 1, 0]]

    def run(label, rate):
        return {"label": label, "metrics": {"output_throughput": rate} if rate is not None else {}}

    chosen = bench.best_rounds([[run("a", 100.0), run("b", 90.0)],
                                [run("a", 80.0), run("b", 120.0)],
                                [run("a", None), run("b", 110.0)]])
    assert [c["label"] for c in chosen] == ["a", "b"]
    assert [c["metrics"]["output_throughput"] for c in chosen] == [100.0, 120.0]
    assert chosen[0]["rounds"] == {"output_throughput": [100.0, 80.0, 0.0], "chosen": 0}
    assert chosen[1]["rounds"] == {"output_throughput": [90.0, 120.0, 110.0], "chosen": 1}
