"""Fixtures for the benchmark tests: the benchmark modules, loaded by path (``benchmarks/`` is not a
package, and its ``datasets.py`` must not shadow other top-level modules)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    """``benchmarks/<name>.py`` as module ``_radixlm_bench_<name>`` (the names bench_serving uses)."""
    mod_name = f"_radixlm_bench_{name}"
    if mod_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(mod_name, BENCH / f"{name}.py")
        module = sys.modules[mod_name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[mod_name]


@pytest.fixture(scope="session")
def bench():
    return load("bench_serving")


@pytest.fixture(scope="session")
def ds():
    return load("datasets")


@pytest.fixture(scope="session")
def stories_tok(ds, stories_path):
    return ds.load_tokenizer(stories_path)
