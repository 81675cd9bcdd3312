"""``radixlm bench <name>`` dispatches to the checkout's benchmarks/ scripts; an unknown name is a usage error."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "radixlm.cli", "bench", *args], capture_output=True, text=True,
                          timeout=120)


def test_unknown_benchmark_is_a_usage_error():
    proc = _run(["nope"])
    assert proc.returncode == 2 and "usage: radixlm bench {serving|one_batch|offline|grammar|suite}" in proc.stderr


@pytest.mark.parametrize("name,script", [("one_batch", "bench_one_batch.py"), ("offline", "bench_offline.py"),
                                         ("serving", "bench_serving.py")])
def test_each_benchmark_answers_help(name, script):
    proc = _run([name, "--help"])
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout and ("--model" in proc.stdout or "--base-url" in proc.stdout)
