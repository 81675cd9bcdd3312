"""One short live run of bench_serving against a real stories260K server (native ``/generate``,
plus radixlm's OpenAI ``/v1/completions`` side by side when the server has it), and the
``radixlm bench serving`` entry point."""

from __future__ import annotations

import json

import httpx
import pytest

try:  # ``python -m pytest`` (repo root on sys.path), as tests/gpu does
    from tests.server.helpers import BASE_ARGS, ServerProcess
except ModuleNotFoundError:  # plain ``pytest``: tests/ itself is on sys.path
    from server.helpers import BASE_ARGS, ServerProcess


@pytest.fixture(scope="module")
def server(stories_path):
    srv = ServerProcess.start(["--model-path", stories_path, *BASE_ARGS])
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


def server_model(server) -> str:
    return httpx.get(server.url + "/get_model_info", timeout=10).json()["model_path"]


def test_cli_entry_point(capsys):
    from radixlm.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", "serving", "--help"])
    assert exc.value.code == 0 and "--request-rate" in capsys.readouterr().out
    assert main(["bench", "nope"]) == 2
