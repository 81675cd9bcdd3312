"""``radixlm --version`` prints ``radixlm <version>`` of the installed distribution and exits 0."""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest


def _run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_flag_prints_the_installed_version(flag):
    proc = _run([sys.executable, "-m", "radixlm.cli", flag])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"radixlm {version('radixlm')}\n"


def test_console_script_version():
    script = shutil.which("radixlm") or str(Path(sys.executable).with_name("radixlm"))
    if not Path(script).exists():
        pytest.skip("the radixlm console script is not installed")
    proc = _run([script, "--version"])
    assert proc.returncode == 0 and proc.stdout.strip() == f"radixlm {version('radixlm')}", proc.stderr
    assert "--version" in _run([script, "--help"]).stdout
