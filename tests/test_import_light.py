"""Importing the frontend and the radix cache must not import torch (fresh interpreter)."""

import os
import subprocess
import sys
import tempfile

import pytest

import radixlm


def _modules_after_import(module: str) -> set[str]:
    # Run in an empty directory so nothing in the cwd can shadow the package. When radixlm was
    # found through a plain directory named radixlm (site-packages, a symlink farm on PYTHONPATH),
    # propagate its parent; an editable install resolves through its own finder.
    env = dict(os.environ)
    package_dir = os.path.dirname(os.path.abspath(radixlm.__file__))
    if os.path.basename(package_dir) == "radixlm":
        root = os.path.dirname(package_dir)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


@pytest.mark.parametrize("module", ["radixlm", "radixlm.radix_cache", "radixlm.radix_cache.approx_tree", "radixlm.lang",
                                    "radixlm.managers.load_balance"])
def test_import_does_not_pull_torch(module: str) -> None:
    modules = _modules_after_import(module)
    assert module in modules
    assert "torch" not in modules


def test_radix_cache_is_stdlib_only() -> None:
    modules = _modules_after_import("radixlm.radix_cache")
    assert "numpy" not in modules
