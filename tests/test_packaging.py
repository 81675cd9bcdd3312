"""Every source folder with an __init__.py is listed in pyproject's packages (a non-editable install
would silently leave out the others)."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed():
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    dirs = cfg["package-dir"]
    expected = set()
    for pkg, folder in dirs.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder)
            expected.add(".".join([pkg, *rel.parts]) if rel.parts else pkg)
    assert expected - listed == set(), f"missing from [tool.setuptools] packages: {sorted(expected - listed)}"
