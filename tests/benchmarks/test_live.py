"""Short live runs of bench_serving against a real stories260K server (native ``/generate``, plus
radixlm's OpenAI ``/v1/completions`` side by side when the server has it; the tool-calls workload on
``/v1/chat/completions`` with and without the tool grammar), and the ``radixlm bench serving`` entry
point."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

try:  # ``python -m pytest`` (repo root on sys.path), as tests/gpu does
    from tests.server.helpers import BASE_ARGS, ServerProcess
except ModuleNotFoundError:  # plain ``pytest``: tests/ itself is on sys.path
    from server.helpers import BASE_ARGS, ServerProcess

HERMES = Path(__file__).resolve().parents[1] / "openai_api" / "hermes.jinja"  # a template with tools


@pytest.fixture(scope="module")
def server(stories_path):
    srv = ServerProcess.start(["--model-path", stories_path, *BASE_ARGS, "--chat-template", str(HERMES)])
    yield srv
    assert srv.stop() == 0


def test_shared_prefix_run_writes_sane_json(bench, server, tmp_path):
    has_v1 = httpx.get(server.url + "/v1/models", timeout=10).status_code == 200
    targets = ["--base-url", f"native={server.url}", "--backend", "radixlm"]
    if has_v1:
        targets += ["--base-url", f"v1={server.url}", "--backend", "openai"]
    out = tmp_path / "run.json"
    bench.main([*targets, "--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "2",
                "--gsp-prompts-per-group", "4", "--gsp-system-prompt-len", "64", "--gsp-question-len", "8",
                "--gsp-output-len", "4", "--max-concurrency", "4", "--disable-tqdm", "--output", str(out)])
    payload = json.loads(out.read_text())  # strict JSON (no Infinity)
    assert payload["dataset"]["name"] == "generated-shared-prefix" and payload["request_rate"] == "inf"
    assert payload["tokenizer"] == server_model(server)
    for target in payload["targets"]:
        m = target["metrics"]
        assert (m["completed"], m["failed"]) == (8, 0), target
        assert m["total_output_tokens"] == 8 * 4  # EOS ignored: exactly O tokens each
        assert m["total_input_tokens"] >= 8 * 72
        assert m["output_throughput"] > 0 and m["request_throughput"] > 0
        assert 0 < m["median_ttft_ms"] <= m["median_e2e_latency_ms"] and m["mean_tpot_ms"] > 0
        assert m["p99_itl_ms"] >= m["median_itl_ms"] > 0
        assert m["cache_hit_rate"] > 0, target  # the shared system prompts hit the radix cache
        assert len(target["requests"]) == 8
    assert [row["metric"] for row in payload["table"]][:2] == ["completed", "failed"]


def test_tool_calls_with_and_without_the_constraint(bench, server, tmp_path, capsys):
    """One server, three tool_choice values side by side; required is all valid calls (the grammar),
    none is plain text (no tools in the prompt)."""
    out = tmp_path / "tools.json"
    bench.main(["--base-url", f"radixlm={server.url}", "--backend", "openai-chat", "--dataset-name", "tool-calls",
                "--num-prompts", "4", "--tool-output-len", "160", "--max-concurrency", "2", "--tool-choice", "required",
                "--tool-choice", "auto", "--tool-choice", "none", "--disable-tqdm", "--output", str(out)])
    payload = json.loads(out.read_text())
    assert payload["dataset"] == {"name": "tool-calls", "seed": 0, "num_prompts": 4, "tool_output_len": 160}
    targets = {t["label"]: t for t in payload["targets"]}
    assert list(targets) == ["radixlm-required", "radixlm-auto", "radixlm-none"]
    for label, t in targets.items():
        m = t["metrics"]
        assert t["tool_choice"] == label.split("-")[1] and (m["completed"], m["failed"]) == (4, 0), t
        assert 0 < m["median_ttft_ms"] <= m["median_e2e_latency_ms"] and m["mean_tpot_ms"] > 0
    assert targets["radixlm-required"]["metrics"]["tool_call_rate"] == 1.0
    assert targets["radixlm-none"]["metrics"]["tool_call_rate"] == 0.0
    # the rendered tools make the constrained prompts longer than the same requests without them
    inputs = {k: t["metrics"]["total_input_tokens"] for k, t in targets.items()}
    assert inputs["radixlm-required"] == inputs["radixlm-auto"] > inputs["radixlm-none"]
    table = capsys.readouterr().out
    assert "tool_call_rate" in table and "radixlm-none/radixlm-required" in table


def server_model(server) -> str:
    return httpx.get(server.url + "/get_model_info", timeout=10).json()["model_path"]


def test_cli_entry_point(capsys):
    from radixlm.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", "serving", "--help"])
    assert exc.value.code == 0 and "--request-rate" in capsys.readouterr().out
    assert main(["bench", "nope"]) == 2
