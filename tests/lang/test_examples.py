"""Smoke-run every example against the session's live servers (small max_tokens).

The examples are written for the SmolLM2 demo model; the smoke runs that only check mechanics use
the much faster stories260K server, json_decode (which needs a model that closes its JSON) SmolLM2.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import require_regex

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMES = ["quickstart", "multi_turn_chat", "fork_join_tips", "json_decode", "react_agent", "offline_engine"]


def run_example(name: str, *args: str, timeout_s: float = 180) -> str:
    proc = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), *args], capture_output=True,
                          text=True, timeout=timeout_s)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.mark.parametrize("name", NAMES)
def test_example_is_short_and_says_how_to_launch(name):
    source = (EXAMPLES / f"{name}.py").read_text()
    assert len(source.splitlines()) < 100
    assert f"python examples/{name}.py" in source.split('"""')[1]


@pytest.mark.parametrize("name, expect", [
    ("quickstart", "coastal:"),
    ("multi_turn_chat", "from the cache"),
    ("fork_join_tips", "summary:"),
    ("react_agent", "final answer:"),
])
def test_example_runs_against_the_server(name, expect, stories_runtime):
    args = ["--url", stories_runtime.url]
    if name != "react_agent":
        args += ["--max-tokens", "8"]
    assert expect in run_example(name, *args)


def test_json_decode_example(smollm2_runtime):
    require_regex(smollm2_runtime.endpoint)
    assert "city_by_schema" in run_example("json_decode", "--url", smollm2_runtime.url)


def test_offline_engine_example(stories_path):
    assert "direct:" in run_example("offline_engine", "--model-path", stories_path, "--max-tokens", "6")
